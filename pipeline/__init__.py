"""modelwheel's build pipeline: export -> compile -> verify -> package a PyTorch model as a wheel."""
