"""The bake and the runtime agree on the Kafka security they allow.

The pre-gen hook cannot import the generated package, so both keep their own sets;
this compares them with each other and with the choices in cookiecutter.json.
"""

import ast
import json

import pytest
from conftest import TEMPLATE

CONFIG_PY = TEMPLATE / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}" / "pipeline" / "config.py"
CHOICES = json.loads((TEMPLATE / "cookiecutter.json").read_text())


def runtime_set(name: str) -> set[str]:
    """A set literal assigned at the top of the generated config.py, read without importing it."""
    for node in ast.parse(CONFIG_PY.read_text()).body:
        if isinstance(node, ast.Assign) and [target.id for target in node.targets] == [name]:
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{name} not found in {CONFIG_PY}")


def test_security_protocols_agree_between_answers_hook_and_runtime(pre_gen):
    answers = set(CHOICES["kafka_security_protocol"])
    assert answers == pre_gen.SECURITY_PROTOCOLS == runtime_set("SECURITY_PROTOCOLS")
    assert "SASL_PLAINTEXT" not in answers


def test_sasl_mechanisms_agree_between_answers_hook_and_runtime(pre_gen):
    answers = set(CHOICES["kafka_sasl_mechanism"]) - {"none"}
    assert answers == pre_gen.SASL_MECHANISMS == runtime_set("SASL_MECHANISMS")


@pytest.mark.parametrize(
    ("answers", "named"),
    [
        ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN"}, "kafka_security_protocol"),
        ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "GSSAPI"}, "kafka_sasl_mechanism"),
    ],
)
def test_an_answer_outside_the_choices_is_refused(pre_gen, answers, named):
    errors = pre_gen.check_security(answers["kafka_security_protocol"], answers["kafka_sasl_mechanism"])
    assert errors and errors[0].startswith(f"{named}: "), errors
