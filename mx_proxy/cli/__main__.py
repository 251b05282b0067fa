"""``python -m mx_proxy.cli``: the same as the ``mx-proxy`` command."""

import sys

from mx_proxy.cli.main import main

sys.exit(main())
