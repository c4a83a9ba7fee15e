"""Results as data: typed documents with a schema version and `load` by version (documents.py), the one write
policy of every results file (write.py), the standard run's document (run_document.py) with its blocks
(summary.py, measurement.py, parameters.py, samples.py, series.py, verdict.py, blocklatency.py,
storage_info.py), where outputs go (outputs.py), and the merge of ranks (merge.py), which combines the ranks'
recorders and runs the single-run summary code beside it."""
