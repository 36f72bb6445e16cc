"""The Python API: the engine fed from trio, asyncio or any thread, and its Prometheus figures."""
