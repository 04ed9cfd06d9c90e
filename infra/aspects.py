"""Names and tags for everything a stack holds, CDK's own constructs included.

CDK pipelines and other L2s make IAM roles of their own with generated names; `NameRoles` gives
each unnamed one `skypurza-<stage>-<component>-<construct path>` so every role is the stage's.
"""

from __future__ import annotations

import re

import jsii
from aws_cdk import Aspects, CfnResource, IAspect, Stack, Tags
from constructs import IConstruct

from skypurza.events import naming


def role_purpose(path: str) -> str:
    """A construct path as a name part: lower case, '.' between the path's parts."""
    parts = [re.sub(r"[^a-z0-9]+", "", p.lower()) for p in path.split("/")]
    return ".".join(p for p in parts if p) or "role"


@jsii.implements(IAspect)
class NameRoles:
    def __init__(self, stage: str, component: str) -> None:
        self.stage, self.component = stage, component

    def visit(self, node: IConstruct) -> None:
        # By CloudFormation type: a construct made on the JavaScript side may not come back as
        # its Python class.
        if not CfnResource.is_cfn_resource(node):
            return
        kind = node.cfn_resource_type
        key = {"AWS::IAM::Role": "RoleName", "AWS::EC2::LaunchTemplate": "LaunchTemplateName"}.get(kind)
        if key is None:
            return
        current = getattr(node, "role_name" if kind == "AWS::IAM::Role" else "launch_template_name", None)
        if isinstance(current, str) and current.startswith(f"{naming.PROJECT}-"):
            return
        stack = Stack.of(node)
        purpose = role_purpose(node.node.path[len(stack.node.path):].strip("/").removesuffix("/Resource"))
        value = (naming.role_name(self.stage, self.component, purpose) if kind == "AWS::IAM::Role"
                 else naming.name(self.stage, self.component, purpose))
        node.add_property_override(key, value)


def name_and_tag(stack: Stack, stage: str, component: str) -> None:
    Aspects.of(stack).add(NameRoles(stage, component))
    for key, value in naming.base_tags(stage).items():
        Tags.of(stack).add(key, value, priority=300)  # above anything a parent scope adds
