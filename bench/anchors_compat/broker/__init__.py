"""The import paths the side-by-side kit's `bench_ledgermq.py` was written
against, before the layout change moved the product under `ledgermq.`:
`broker.config`, `broker.launcher` and `ledgermq.codes` are the modules
`ledgermq.broker.config`, `ledgermq.broker.launcher` and
`ledgermq.base.codes` themselves (aliases, not copies).

Only the development venv sees this folder (`make setup` writes a `.pth`
for it), so the kit runs against this checkout as its README says; the
product's wheel ships nothing of it (no generic top-level names there).
"""

import sys

import ledgermq.base.codes
from ledgermq.broker import config, launcher

sys.modules[f"{__name__}.config"] = config
sys.modules[f"{__name__}.launcher"] = launcher
# The kit imports it right after `broker.config`.
sys.modules.setdefault("ledgermq.codes", ledgermq.base.codes)
