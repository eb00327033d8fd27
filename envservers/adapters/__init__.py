"""Adapters that run environments others wrote behind our server: skyrl-gym, OpenEnv."""
