"""coding-agent-env's path guard for hardened verify: the directory Python would put first goes last instead.

Hardened verify runs every command with PYTHONSAFEPATH=1 and PYTHONPATH naming only the read-only directory that
holds this file. Python then puts neither the current directory (`-c`, `-m`, stdin) nor a script's directory
first on `sys.path`, and imports this module at start-up (site's `sitecustomize` hook, after site-packages are
on the path). It:

1. removes its own directory from `sys.path` (nothing else lives there; a tool sees the path it expects);
2. runs the system's own `sitecustomize`, if any (Debian ships one), found on the path as it now is: before
   step 3, so nothing of the agent's can stand in for it;
3. appends the directory Python would have put first (the same rule as CPython's: `''` for `-c` and stdin,
   the current directory for `-m`, the script's real directory for a script) at the END of `sys.path`.

So a name the standard library or an installed package has resolves there (a planted `json.py`, `unittest/`
or `pytest.py` shadows nothing), and the agent's own modules (`solution.py`, a script's sibling module) import
as before. Only where Python runs with its safe path on (3.11+, PYTHONSAFEPATH not unset by the command);
older Pythons put the directory first themselves and are left alone.

Total: it never raises (a failure leaves `sys.path` as the safe path made it, the stricter outcome); standard
library only, and Python 2 syntax too (an old interpreter on PYTHONPATH must still start).
"""

import os
import sys


def _own_dir():
    return os.path.dirname(os.path.abspath(__file__))


def _drop_own_dir(own):
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != own]


def _chain():
    """Run the next `sitecustomize` on the path (the system's) through the import system already loaded (nothing
    more is imported), reporting its failure as site.py would; this module stays `sitecustomize` if none."""
    this = sys.modules.pop(__name__, None)
    try:
        __import__("sitecustomize")
    except ImportError as err:
        if getattr(err, "name", "sitecustomize") != "sitecustomize":  # (Python 2 has no name: none found)
            _report(err)
    except Exception as err:  # noqa: BLE001 - what site.py does for a failing sitecustomize
        _report(err)
    if "sitecustomize" not in sys.modules and this is not None:
        sys.modules[__name__] = this


def _report(err):
    sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n" % (type(err).__name__, err))


def _first_dir():
    """What CPython puts first on `sys.path` without the safe path (`_PyPathConfig_ComputeSysPath0`), or None."""
    argv = getattr(sys, "argv", None) or [""]
    first = argv[0]
    if first in ("-c", ""):
        return ""
    if first == "-m":
        return os.getcwd()
    if os.path.isdir(first):
        return None  # a directory run as a script: Python puts it first itself, safe path or not
    return os.path.dirname(os.path.realpath(first))


def _guard():
    own = _own_dir()
    _drop_own_dir(own)
    try:
        _chain()
    except Exception:
        pass  # no system hook then; the guard itself still applies
    if getattr(sys.flags, "safe_path", False):
        first = _first_dir()
        if first is not None and first not in sys.path:
            sys.path.append(first)


try:
    _guard()
except Exception:
    pass
