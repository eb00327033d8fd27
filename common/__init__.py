"""What several roles share and is not about the bus: config loading, the metrics server,
process plumbing. Imports no role."""
