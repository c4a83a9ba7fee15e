"""The modelled GPU: roofline iteration cost, HBM prefix cache and continuous batching per replica."""
