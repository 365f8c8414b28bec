# cachepilot: two commands matter — `make run` and `make test`.
# Every other target is a step they take.

PY       := .venv/bin/python
PIP      := .venv/bin/pip
STAMP    := .venv/.installed
APT_PKGS := clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev zstd linux-source-6.12 \
            libzstd-dev fio rocksdb-tools iproute2 python3-venv systemd etcd-server
# installed without their recommendations (prometheus would pull in
# node-exporter and smartmontools, and start them where systemd runs)
APT_LEAN := prometheus
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test deps build bpf clean kernel kernel-test bench e2e fuzz sanitize image chaos \
        install consolidate

run: build
	.venv/bin/cachepilot run --config configs/demo.yaml

test: build
	bash tests/run.sh

# System packages: installed only when one is missing.
deps:
	@missing=$$(for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:" $$missing; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@missing=$$(for p in $(APT_LEAN); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:" $$missing; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
			--no-install-recommends $$missing; \
	fi

# An editable install through a package_dir mapping (cachepilot -> root/,
# ...) always ends with setuptools' informational notice "Editable
# installation" (its InformationOnly class: nothing is wrong); it is
# filtered by its text and no other warning is.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

$(STAMP): pyproject.toml setup.py | deps
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(QUIET_EDITABLE) $(PIP) install -q -e '.[test]'
	touch $@

# Re-run the package build every time so the native core tracks its sources.
build: $(STAMP) bpf
	$(QUIET_EDITABLE) $(PIP) install -q --no-deps --no-build-isolation -e .

bpf: deps
	$(MAKE) -s -C bpf

# The install the systemd units and the container image expect: a venv at
# PREFIX (default /opt/cachepilot) holding this checkout, built and
# installed as a wheel (not editable: the checkout can go), and a link
# BINDIR/cachepilot (default /usr/local/bin) to its command.  Debian 12
# refuses a system-wide pip install (PEP 668); a venv of its own is not.
# The venv is made with INSTALL_PYTHON (the system's python3, which every
# user -- the controller unit's dynamic one too -- can run; a pyenv or
# home-folder python could not be).  Dependencies come from the package
# index (or pip's find-links/cache).  `make install PREFIX=/tmp/p
# BINDIR=/tmp/b` installs elsewhere (a venv is not relocatable, so there
# is no DESTDIR).  Run again to upgrade in place.
PREFIX         := /opt/cachepilot
BINDIR         := /usr/local/bin
INSTALL_PYTHON := /usr/bin/python3
PIP_INSTALL    := -q
install: deps
	$(INSTALL_PYTHON) -m venv $(PREFIX)
	$(PREFIX)/bin/pip install $(PIP_INSTALL) $(CURDIR)
	mkdir -p $(BINDIR)
	ln -sfn $(PREFIX)/bin/cachepilot $(BINDIR)/cachepilot
	@echo "installed: $(BINDIR)/cachepilot -> $(PREFIX)/bin/cachepilot"

bench: build
	for b in experiments/bench_*.py; do $(PY) $$b || exit 1; done

# Coverage-guided fuzzing of every trace reader and the record reader
# (fuzz/run.py: atheris over the Python readers, libFuzzer with ASan and
# UBSan over the native parser), FUZZ_RUNS executions a target; writes
# experiments/results/fuzz.json.  Not part of make test.
FUZZ_RUNS ?= 1000000
FUZZ_JOBS ?= 1
fuzz: build
	$(PIP) install -q 'atheris>=2.3'
	$(PY) -m fuzz.run --runs $(FUZZ_RUNS) --jobs $(FUZZ_JOBS)

# The native core and the BPF loaders built with ASan and UBSan, run
# through the native tests and a short fuzz, and the sampler loader under
# valgrind for one agent interval (fuzz/sanitize.sh).  Not part of make test.
sanitize: build
	@dpkg -s valgrind >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq valgrind; }
	fuzz/sanitize.sh

# The agent+controller OCI image (deploy/container/Containerfile), built
# without a container daemon: buildah with chroot isolation over a
# debootstrap'd Debian 12 base; writes out/image/cachepilot-*.oci.tar.
IMAGE_PKGS := buildah skopeo debootstrap
image:
	@missing=$$(for p in $(IMAGE_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi
	$(SUDO) deploy/container/build-image.sh

kernel:
	kernel/build

# bpf: the agent's sampler is loaded in the VM too
kernel-test: kernel bpf
	kernel/test

# The autopilot end to end on the cache_ext kernel, in the VM: real tenants
# under (a) an equal split, (b) the controller's limits, (c) its limits and
# policies.  Each tenant reads its own share of the data disk (io.max in the
# guest), under the disk's own throttle (under TCG the host's page cache
# would make misses nearly free).  Writes
# experiments/results/e2e_vm.{json,png}.  Not part of make test.
# E2E_ARGS: more arguments for e2e_vm.py (its --help), e.g. a short
# diagnostic run: make e2e E2E_ARGS="--only default_equal,agent_sampling"
E2E_DISK := throttling.bps-total=67108864,throttling.iops-total=8000
E2E_ARGS :=
e2e: build kernel
	kernel/vm -H -m 3G -s 2 -t 6600 -D 3G -d "$(E2E_DISK)" \
		-W experiments/results -a $(CURDIR) $(foreach a,$(E2E_ARGS),-a $(a)) \
		kernel/tests/e2e-in-vm.sh

# Faults on real cgroups, counted (experiments/chaos.py): the agent, the
# controller and the sampler killed and stopped, tenant cgroups deleted and
# made again, anonymous memory growing toward a limit, the controller's link
# down; 30 minutes and 200 faults at least by default.  Writes
# experiments/results/chaos.{json,png}.  Not part of make test.
# CHAOS_ARGS: e.g. --minutes 5 --faults 20 --seed 2
CHAOS_ARGS :=
chaos: build
	$(PY) experiments/chaos.py $(CHAOS_ARGS)

# Consolidation for real (experiments/consolidate_host.py): three emulated
# hosts on this machine (parent cgroups, each with its memory, a disk read
# throttle and a CPU quota, each with its own agent), seven real tenants
# behind the exporter, the controller over mutual TLS; a run in place, the
# plan made from live data and carried out, then the memory-only plan and
# one host tighter, forced.  Writes experiments/results/consolidate_host.
# {json,png}.  Not part of make test.  CONSOLIDATE_ARGS: e.g. --quick
CONSOLIDATE_ARGS :=
consolidate: build
	$(PY) experiments/consolidate_host.py $(CONSOLIDATE_ARGS)

clean:
	rm -rf .venv build *.egg-info out
	$(MAKE) -s -C bpf clean
