import os

# Tests never read or write the default run store (runs/): every result is computed fresh.
os.environ.setdefault("PROXY_STORE", "off")
