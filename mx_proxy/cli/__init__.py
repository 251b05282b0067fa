"""The ``mx-proxy`` command: ``python -m mx_proxy.cli`` or the ``mx-proxy`` console script.
"""
