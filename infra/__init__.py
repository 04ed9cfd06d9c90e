"""SkyPurza's control plane on AWS as code (Python CDK). Not part of the `skypurza` wheel.

`synth(outdir)` builds the whole app (the pipeline with its promoted stages, and each DR mirror)
and writes the cloud assembly; `cdk synth` runs the same through app.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App, cx_api  # noqa: E402

from . import busconfig, config, costs, pipeline  # noqa: E402,F401
from . import config as _config  # noqa: E402
from .aspects import name_and_tag  # noqa: E402,F401
from .pipeline import PipelineStack  # noqa: E402
from .stage import SkypurzaStage  # noqa: E402


@dataclass
class Deployment:
    app: App
    infra: _config.InfraConfig
    pipeline: PipelineStack
    stages: dict[str, SkypurzaStage]  # every stage, promoted and mirrors
    assembly: cx_api.CloudAssembly | None = None


def build(app: App, infra: _config.InfraConfig) -> Deployment:
    pipeline = PipelineStack(app, infra)
    stages = dict(pipeline.stages)
    for mirror in infra.mirrors:  # deployed by the pipeline's step after its source stage
        stages[mirror.stage] = SkypurzaStage(app, mirror, infra)
    return Deployment(app, infra, pipeline, stages)


def synth(outdir: str | Path, infra: _config.InfraConfig | None = None) -> Deployment:
    app = App(outdir=str(outdir))
    dep = build(app, infra or _config.load())
    dep.assembly = app.synth()
    return dep
