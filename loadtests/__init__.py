"""Locust load tests for sglang's OpenAI-compatible endpoints (see README.md).

Only ``locustfile.py`` imports locust: importing locust monkey-patches the standard library with
gevent, so the runner and the tests keep it in the locust subprocess.
"""
