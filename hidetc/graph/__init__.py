"""Graph IR, the operator catalogue, graph passes and the numpy reference interpreter."""
