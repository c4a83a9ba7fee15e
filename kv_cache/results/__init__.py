"""Results as data: typed documents with a schema version and `load` by version (documents.py), and the one
write policy of every results file (write.py). The merge of ranks, which combines the ranks' recorders and
runs the single-run summary code, is kv_cache/results/merge.py (beside that summary code)."""
