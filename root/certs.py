"""`cachepilot certs`: the certificates of a cachepilot deployment.

    cachepilot certs init [DIR] [--host NAME]...   a CA, the controller's, this node's and
                                                   an admin's certificates, and the
                                                   controller.yaml and agent.yaml that use them
    cachepilot certs node NAME [--dir D]            a certificate for node NAME
    cachepilot certs admin [NAME] [--dir D]         an admin certificate

One private CA signs everything.  The controller's certificate names the
hosts agents reach it by (localhost and 127.0.0.1, plus every --host); a
node's certificate has the node's name as its common name and `node` as
its organisational unit, an admin's has `admin` (controller/auth.py reads
them).  Keys are ECDSA P-256, written readable by their owner only; an
existing file is never overwritten unless --force says so.

`init` also writes a controller config and an agent config that follows
it over mutual TLS (root/onboard.py), so that both start as written.
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
from pathlib import Path

from cachepilot.core.errors import UserError

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")     # the controller's node names
DEFAULT_DAYS = 825


def register(subparsers):
    p = subparsers.add_parser(
        "certs", help="make the CA and the controller's, nodes' and admins' certificates",
        description="Make a private CA, the controller's certificate, and one certificate "
                    "per node and for admins (mutual TLS), so that nobody has to write "
                    "openssl commands by hand.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default="certs",
                        help="folder of the CA and the files (default ./certs)")
    common.add_argument("--days", type=int, default=DEFAULT_DAYS,
                        help=f"validity in days (default {DEFAULT_DAYS})")
    common.add_argument("--force", action="store_true", help="overwrite existing files")
    sub = p.add_subparsers(dest="certs_command", metavar="ACTION")
    sub.required = True
    s = sub.add_parser("init", parents=[common],
                       help="a CA, the controller's, this node's and an admin's "
                            "certificates, and a controller.yaml and agent.yaml that use "
                            "them (mutual TLS)")
    s.add_argument("folder", nargs="?", metavar="DIR",
                   help="where to write them (same as --dir; default ./certs)")
    s.add_argument("--host", action="append", default=[], metavar="NAME",
                   help="a DNS name or IP address agents reach the controller by "
                        "(repeatable; localhost and 127.0.0.1 are always in)")
    from cachepilot.onboard import add_arguments
    add_arguments(s)
    s = sub.add_parser("node", parents=[common],
                       help="node-NAME.crt and node-NAME.key for node NAME, signed by the CA")
    s.add_argument("name")
    s = sub.add_parser("admin", parents=[common],
                       help="NAME.crt and NAME.key (default admin) with the admin role")
    s.add_argument("name", nargs="?", default="admin")
    p.set_defaults(func=cmd_certs)


def cmd_certs(args) -> int:
    if args.days < 1:
        raise UserError(f"--days {args.days}: expected at least 1")
    folder = Path(args.dir)
    if args.certs_command == "init":
        from cachepilot.onboard import init_deployment
        if args.folder is not None:
            if args.dir != "certs" and args.dir != args.folder:
                raise UserError(f"give the folder once: {args.folder} or --dir {args.dir}")
            folder = Path(args.folder)
        written = init_deployment(folder, args)
    elif args.certs_command == "node":
        written = make_leaf(folder, "node", args.name, args.days, args.force)
    else:
        written = make_leaf(folder, "admin", args.name, args.days, args.force)
    for path in written:
        print(f"wrote {path}")
    return 0


# -- making them ----------------------------------------------------------------

def _key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str, ou: str | None = None):
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cachepilot")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _builder(subject, issuer, public_key, days: int):
    from cryptography import x509
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def _check_free(paths, force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise UserError(f"{', '.join(existing)} already exist(s); give --force to replace")


def _write(path: Path, data: bytes, private: bool) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(path, 0o600 if private else 0o644)
    except OSError as err:
        raise UserError(f"{path}: cannot write: {err.strerror}") from None


def _pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _sans(hosts):
    from cryptography import x509
    out, seen = [], set()
    for h in ["localhost", "127.0.0.1", *hosts]:
        if not h or h in seen:
            continue
        seen.add(h)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not re.match(r"^[A-Za-z0-9*.-]+$", h):
                raise UserError(f"--host {h!r}: expected a DNS name or an IP address") \
                    from None
            out.append(x509.DNSName(h))
    return out


def make_ca(folder: Path, days: int = DEFAULT_DAYS, hosts=(), force: bool = False):
    """ca.crt/ca.key and controller.crt/controller.key in `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID
    paths = [folder / n for n in ("ca.crt", "ca.key", "controller.crt", "controller.key")]
    _check_free(paths, force)
    sans = _sans(hosts)
    ca_key = _key()
    ca_name = _name("cachepilot CA")
    ca = (_builder(ca_name, ca_name, ca_key.public_key(), days)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = _key()
    cert = (_builder(_name("cachepilot controller", "controller"), ca_name, key.public_key(),
                     days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    for path, data, private in zip(paths, (_pem(ca), _key_pem(ca_key), _pem(cert),
                                           _key_pem(key)), (False, True, False, True)):
        _write(path, data, private)
    return paths


def _load_ca(folder: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    try:
        ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), None)
    except FileNotFoundError as err:
        raise UserError(f"{err.filename}: no such file; make the CA first with "
                        f"`cachepilot certs init --dir {folder}`") from None
    except (OSError, ValueError) as err:
        raise UserError(f"{folder}: cannot read the CA: {err}") from None
    return ca, key


def make_leaf(folder: Path, role: str, name: str, days: int = DEFAULT_DAYS,
              force: bool = False):
    """A certificate signed by folder's CA for a node (CN = its name) or
    an admin: node-NAME.crt/.key, or NAME.crt/.key for an admin."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID
    if not NAME_RE.match(name):
        raise UserError(f"{role} name {name!r}: expected letters, digits and _.:- only "
                        f"(as in the controller's config)")
    stem = f"node-{name}" if role == "node" else name
    paths = [folder / f"{stem}.crt", folder / f"{stem}.key"]
    _check_free(paths, force)
    ca, ca_key = _load_ca(folder)
    key = _key()
    cert = (_builder(_name(name, role), ca.subject, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(paths[0], _pem(cert), False)
    _write(paths[1], _key_pem(key), True)
    return paths
