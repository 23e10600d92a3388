#!/usr/bin/env python3
"""Writes the defaults of torchtitan's JobConfig as {dotted key: default} JSON, the fixture that
tests/test_config_torchtitan.cpp compares titan's key table with.

    torchtitan_defaults.py JOB_CONFIG_PY RELEASE > tests/fixtures/torchtitan/RELEASE/defaults.json

JOB_CONFIG_PY is torchtitan/config/job_config.py of that release (e.g. `git show
v0.2.2:torchtitan/config/job_config.py` in a torchtitan clone). The file is executed with a stand-in
for torchtitan.tools.logging (its only torchtitan import), so neither torchtitan nor its
dependencies beyond torch need to be installed. Each dataclass field's default is walked in
declaration order; nested dataclasses ([training.dataloader], [quantize.linear.float8]) become
dotted sections; None is written as null.
"""
import dataclasses
import json
import logging
import sys
import types


def main() -> None:
    path, release = sys.argv[1], sys.argv[2]
    stub = types.ModuleType("torchtitan.tools.logging")
    stub.logger = logging.getLogger("torchtitan")
    for name in ("torchtitan", "torchtitan.tools"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torchtitan.tools.logging"] = stub
    module = types.ModuleType("job_config")
    module.__file__ = path
    sys.modules["job_config"] = module  # dataclasses looks the module up by name
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)

    defaults = {}

    def walk(obj, prefix):
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            name = f"{prefix}.{field.name}" if prefix else field.name
            if dataclasses.is_dataclass(value):
                walk(value, name)
            else:
                defaults[name] = value

    walk(module.JobConfig(), "")
    json.dump({"release": release,
               "source": "torchtitan/config/job_config.py, JobConfig() field defaults; null = None",
               "defaults": defaults}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
