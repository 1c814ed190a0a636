"""A PEP 517 build backend for this pure-Python package, so that `pip install ./python` works
without fetching setuptools: it writes the wheel (gemma4c/*.py plus the dist-info files)
itself. The version is gemma4c.__version__."""
import base64
import hashlib
import os
import re
import zipfile

NAME = "gemma4c"
HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def _metadata(version):
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: Python bindings for gemma4c\n"
            "Requires-Python: >=3.8\n" % (NAME, version)).encode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    info = "%s-%s.dist-info" % (NAME, version)
    files = []
    for fn in sorted(os.listdir(os.path.join(HERE, NAME))):
        if fn.endswith(".py"):
            with open(os.path.join(HERE, NAME, fn), "rb") as f:
                files.append(("%s/%s" % (NAME, fn), f.read()))
    files.append((info + "/METADATA", _metadata(version)))
    files.append((info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: gemma4c wheel_backend\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = "\n".join(_record_line(p, d) for p, d in files) + "\n%s/RECORD,,\n" % info
    wheel = "%s-%s-py3-none-any.whl" % (NAME, version)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(path, data)
        z.writestr(info + "/RECORD", record)
    return wheel


def get_requires_for_build_wheel(config_settings=None):
    return []
