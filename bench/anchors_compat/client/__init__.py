"""`client`, the SDK's import path before the layout change, for the
side-by-side kit (see `broker/__init__.py` here): the module *is*
`ledgermq.client`."""

import sys

import ledgermq.client

sys.modules[__name__] = ledgermq.client
