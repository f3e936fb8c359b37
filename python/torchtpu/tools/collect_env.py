"""The environment report for bug reports: `python -m torchtpu` (`--json` for JSON).

Like torch's `python -m torch.utils.collect_env`. It never raises: a part that cannot be
found is reported as the error that stopped it, since a broken setup is what gets reported.
Standard library only at module level: torch and torchtpu are imported inside `collect()`.
"""
import importlib.metadata
import json
import os
import platform
import sys

INTEGRATIONS = ("vllm", "sglang", "torchtitan", "ray", "accelerate", "transformers")
# Set variables that change what torchtpu or its plugin does, besides TORCHTPU_*.
OTHER_VARIABLES = ("TORCH_DEVICE_BACKEND_AUTOLOAD", "XLA_FLAGS", "LIBTPU_INIT_ARGS")


def _installed(dist):
    # Metadata only: importing vllm or ray takes seconds and can fail on its own.
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _error_text(e):
    # torch wraps an autoloaded backend's failure in "Failed to load the backend extension";
    # the reader needs the cause.
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


def compile_cache():
    """The persistent compile cache, found the way crates/engine/src/disk_cache.rs finds it."""
    if os.environ.get("TORCHTPU_CACHE") == "0":
        return {"path": None, "enabled": False, "files": 0, "bytes": 0}
    path = os.environ.get("TORCHTPU_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torchtpu"
    )
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:  # removed while we walk (another process evicting)
                pass
    return {"path": path, "enabled": True, "files": files, "bytes": size}


def _devices(torch, _C):
    """(platform version, PJRT API version, devices); raises when the plugin cannot start."""
    torch.tpu.get_device_name(0)  # starts the client: raises the plugin's error if it cannot
    _, version, _, identity = _C.platform()
    api = getattr(_C, "pjrt_api_version", None)  # absent from extensions built before it
    if api is not None:
        api = "%d.%d" % api()
    else:  # the identity is "fingerprint|major.minor|platform|version" (engine/src/runtime.rs)
        parts = identity.split("|")
        api = parts[1] if len(parts) > 1 else None
    devices = []
    for i in range(torch.tpu.device_count()):
        d = {"index": i, "name": torch.tpu.get_device_name(i)}
        try:
            d["free_bytes"], d["total_bytes"] = torch.tpu.mem_get_info(i)
        except RuntimeError as e:  # a plugin that reports no memory
            d["memory_error"] = str(e)
        devices.append(d)
    return version, api, devices


def collect():
    """The report as a dict (JSON-serializable); keys are always present, None when unknown."""
    info = {
        "torchtpu": _installed("torchtpu"),
        "torchtpu_built_for_torch": None,
        "torch": _installed("torch"),
        "python": platform.python_version(),
        "os": platform.platform(),
        "platform": None,
        "plugin_path": None,
        "pjrt_api_version": None,
        "platform_version": None,
        "devices": None,
        "device_error": None,
        "compile_cache": None,
        "environment": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCHTPU_") or k in OTHER_VARIABLES
        },
        "integrations": {name: _installed(name) for name in INTEGRATIONS},
        "error": None,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        import torchtpu

        info["torchtpu"] = torchtpu.__version__
        info["torchtpu_built_for_torch"] = torchtpu._C.built_with_torch()
        info["platform"] = torchtpu.PLATFORM
        info["plugin_path"] = torchtpu.PLUGIN_PATH
    except Exception as e:  # torchtpu or torch cannot load: that is the report
        info["error"] = _error_text(e)
    else:
        try:
            info["platform_version"], info["pjrt_api_version"], info["devices"] = _devices(torch, torchtpu._C)
        except Exception as e:
            info["device_error"] = _error_text(e)
    # Last: starting the client writes the plugin's fingerprint memo into the cache.
    info["compile_cache"] = compile_cache()
    return info


def _size(n):
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def format_text(info):
    def line(key, value):
        return f"{key + ':':<24}{'unknown' if value is None else value}"

    out = []
    if info["error"]:
        out.append(line("error", info["error"]))
    built = info["torchtpu_built_for_torch"]
    out += [
        line("torchtpu", f"{info['torchtpu']} (built for torch {built})" if built else info["torchtpu"]),
        line("torch", info["torch"]),
        line("Python", info["python"]),
        line("OS", info["os"]),
        line("platform", info["platform"]),
        line("plugin", info["plugin_path"]),
        line("PJRT API version", info["pjrt_api_version"]),
        line("platform version", info["platform_version"]),
    ]
    if info["device_error"]:
        out.append(line("devices", "error: " + info["device_error"]))
    else:
        out.append(line("devices", None if info["devices"] is None else len(info["devices"])))
        for d in info["devices"] or []:
            if "total_bytes" in d:
                memory = f"{_size(d['free_bytes'])} free of {_size(d['total_bytes'])}"
            else:
                memory = d.get("memory_error", "")
            out.append(f"  tpu:{d['index']}  {d['name']}  {memory}")
    cache = info["compile_cache"]
    if cache["enabled"]:
        files = f"{cache['files']} file" + ("" if cache["files"] == 1 else "s")
        out.append(line("compile cache", f"{cache['path']} ({files}, {_size(cache['bytes'])})"))
    else:
        out.append(line("compile cache", "off (TORCHTPU_CACHE=0)"))
    out.append(line("environment", "" if info["environment"] else "(no TORCHTPU_* variables set)"))
    out += [f"  {k}={v}" for k, v in info["environment"].items()]
    out.append(line("integrations", ""))
    out += [f"  {name:<14}{v or 'not installed'}" for name, v in info["integrations"].items()]
    return "\n".join(s.rstrip() for s in out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--json"]):
        print("usage: python -m torchtpu [--json]", file=sys.stderr)
        return 2
    info = collect()
    print(json.dumps(info, indent=2) if argv else format_text(info))
    return 0
