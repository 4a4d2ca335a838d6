"""Metal Shading Language to OpenCL C: lexer, names, prelude, token rewrite rules, the translator."""
