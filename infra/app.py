"""`cdk synth` / `cdk deploy` entry (cdk.json): the config comes from cdk.json's context."""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _infra():
    # infra/ is not an installed package: load it by path as `infra`.
    spec = importlib.util.spec_from_file_location("infra", HERE / "__init__.py", submodule_search_locations=[str(HERE)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["infra"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    infra = _infra()
    from aws_cdk import App

    app = App(outdir=None if "CDK_OUTDIR" in __import__("os").environ else str(HERE / "cdk.out"))
    try:
        context = app.node.try_get_context(infra.config.CONTEXT_KEY)
        # `cdk` passes cdk.json's context; `python app.py` alone reads the file itself.
        cfg = infra.config.parse(context) if context is not None else infra.config.load()
    except ValueError as exc:  # pydantic's ValidationError is one: one message, no traceback
        print(f"infra: invalid configuration in cdk.json ({infra.config.CONTEXT_KEY}): {exc}", file=sys.stderr)
        return 2
    infra.build(app, cfg)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
