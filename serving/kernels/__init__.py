"""Native kernels the runtime builds on the host it runs on, each beside the PyTorch form it
replaces where it can (decode attention over the KV pool)."""
