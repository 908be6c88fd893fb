"""mitmproxy integration: polar's addons (chain.py), the polar contentview, running the proxy, transparent mode."""
