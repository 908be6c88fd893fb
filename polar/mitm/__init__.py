"""mitmproxy integration: the addon, the polar contentview, running the proxy, transparent mode."""
