"""Settings of OpenReg's Inductor code generators (openreg/_inductor.py)
that change the code they generate.

Inductor reuses generated code across processes (its FX graph cache, under
TORCHINDUCTOR_CACHE_DIR) by a key made of the graph, the inputs and its own
configuration; it knows nothing of what a device's code generator depends
on. A device's own settings enter that key through the config module given
to ``register_backend_for_device(..., device_custom_config=...)``: this is
OpenReg's. Without it, code generated in one process under one setting is
served to another process under another (seen: a mutant's generated wrapper
served to the unmutated backend in the next run).
"""

import sys

from torch.utils._config_module import install_config_module

# The mutant of OpenReg selected in this process (OPENREG_MUTANT; "" for
# none): a mutant of the code generators generates other code.
mutant: str = ""

install_config_module(sys.modules[__name__])
