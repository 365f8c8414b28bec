"""Build glue: maps the top-level folders onto the `cachepilot` import root
and compiles the native C core.  Everything else lives in pyproject.toml."""
import glob
import os
import shutil
import subprocess

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

# import name -> folder: the import root is mapped onto the top-level
# folders (docs/design.md draws how they may import one another).
ROOTS = {
    "cachepilot": "root",
    "cachepilot.core": "core",
    "cachepilot.models": "models",
    "cachepilot.protocol": "protocol",
    "cachepilot.sim": "sim",
    "cachepilot.agent": "agent",
    "cachepilot.controller": "controller",
}


def packages():
    found = {}
    for name, folder in ROOTS.items():
        found[name] = folder
        if name == "cachepilot":
            continue
        for sub in find_packages(folder):
            found[f"{name}.{sub}"] = os.path.join(folder, *sub.split("."))
    return found


PKGS = packages()
CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-fvisibility=hidden"]


def native(name, sources, **kw):
    return Extension(name, sources=sorted(sources),
                     include_dirs=["bpf/include", "models/native"],
                     extra_compile_args=CFLAGS, **kw)


EXTENSIONS = []
if glob.glob("models/native/mrc/*.c"):
    EXTENSIONS.append(native("cachepilot.models._mrc",
                             glob.glob("models/native/mrc/*.c")))
if glob.glob("models/native/runtime/*.c"):
    EXTENSIONS.append(native(
        "cachepilot.models._runtime",
        glob.glob("models/native/runtime/*.c") +
        glob.glob("bpf/policies/*.bpf.c"),
        libraries=["dl"]))

class build_py_with_bpf(build_py):
    """A wheel carries the agent's BPF side: `make -C bpf` builds the
    sampler, the policy loader and every policy object, and they go into
    cachepilot/agent/bpf/, where agent/binaries.py looks first.  It also
    carries the policy sources and the header they are written against
    (cachepilot/bpf/{include,policies}), where models/runtime.py and
    `cachepilot policy` look for them: a policy of the user's own, or
    `policy new` / `policy check`, compiles against them.  An editable
    install skips this: it finds them all in the checkout."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for pattern in ("bpf/include/*.h", "bpf/policies/*.bpf.c", "bpf/policies/template/*"):
            for src in glob.glob(pattern):
                dest = os.path.join(self.build_lib, "cachepilot", os.path.dirname(src))
                os.makedirs(dest, exist_ok=True)
                shutil.copy2(src, dest)
        if not os.path.exists("bpf/Makefile"):
            return
        subprocess.run(["make", "-s", "-C", "bpf"], check=True)
        dest = os.path.join(self.build_lib, "cachepilot", "agent", "bpf")
        os.makedirs(os.path.join(dest, "policies"), exist_ok=True)
        for name in ("sampler", "policyctl"):
            shutil.copy2(os.path.join("bpf", "out", name), dest)
        for obj in glob.glob("bpf/out/policies/*.bpf.o"):
            shutil.copy2(obj, os.path.join(dest, "policies"))


setup(
    cmdclass={"build_py": build_py_with_bpf},
    packages=list(PKGS),
    package_dir=PKGS,
    package_data={"cachepilot.protocol": ["*.proto"],
                  "cachepilot.models": ["minisim_error.json", "policy_settling.json"]},
    # only the files named above: the C sources under models/native are the
    # extensions' (listed in ext_modules), not packages of their own
    include_package_data=False,
    ext_modules=EXTENSIONS,
)
