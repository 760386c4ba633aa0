"""Callbacks that report from a framework's training loop.

Each lives in its own module so that importing one needs only its framework:
`trainyard.callbacks.lightning`, `trainyard.callbacks.huggingface`,
`trainyard.callbacks.keras`.
"""
