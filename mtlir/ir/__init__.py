"""The IR core: ops, dtypes, the hash-consed UOp, patterns, graph_rewrite, value ranges and the text form."""
