"""Built-in environments: calculator (the demo task), noop (benchmarks), sql, python, mcp."""
