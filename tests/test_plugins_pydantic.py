"""kiro.plugins.no_pydantic_plugins puts a stand-in for pydantic's plugin loader in sys.modules (a read command
then imports no importlib.metadata: tests/test_cli_read.py). A pydantic that asks its loader for a name the
stand-in lacks gets the real loader's, with no plugin loaded, not an AttributeError in every command."""

from __future__ import annotations

import subprocess
import sys


def test_a_name_the_stand_in_lacks_comes_from_the_real_loader_with_no_plugin() -> None:
    probe = ("import sys\n"
             "from kiro.plugins import no_pydantic_plugins\n"
             "no_pydantic_plugins()\n"
             "stand_in = sys.modules['pydantic.plugin._loader']\n"
             "print(stand_in.get_plugins() == (), 'importlib.metadata' in sys.modules)\n"
             "from pydantic.plugin._loader import _plugins, get_plugins\n"  # _plugins is the stand-in's own
             "real = stand_in._plugins is _plugins and stand_in.__getattr__('PYDANTIC_ENTRY_POINT_GROUP')\n"
             "loader = sys.modules['pydantic.plugin._loader']\n"
             "print(real, loader is not stand_in, loader._plugins == {}, list(loader.get_plugins()))\n"
             "import pydantic\n"
             "class M(pydantic.BaseModel):\n    x: int\n"
             "print(M(x=1).x)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True False", "pydantic True True []", "1"], r.stdout
