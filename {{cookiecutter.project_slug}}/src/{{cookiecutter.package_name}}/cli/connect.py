"""What a command does before its work: local servers resolved, Kafka reached, egress sinks checked, Spark built.

Every check here runs before Spark starts, so a bad setting fails in seconds with its name
(exit 2), never as a Kafka client retrying a refused login forever.
"""

from __future__ import annotations

from ..pipeline.config import Config, ConfigError
from .local_servers import resolve, resolve_local_s3, uses_local_broker


def connect(config: Config, egress: bool = False, asked: str | None = None, provision: bool = False) -> Config:
    """The config resolved and checked for a command that talks to Kafka (and, with ``egress``, to the sinks).

    ``asked`` is the egress stream a command names (`run --layer`, `show`): refused when it is off.
    ``provision`` creates the development output topic of a run on the local broker.

    Example::

        config = connect(configure(load_config("local")), egress=True, asked="kafka_egress")
    """
    from ..pipeline.datasets import datasets_kafka
    from ..pipeline.kafka.clients import check_connection

    datasets_kafka(config)  # each dataset's topics named, none read by two
    local_broker = uses_local_broker(config)
    config = resolve(config, egress=egress)
    # Before Spark: its Kafka client would retry a refused login forever.
    check_connection(config)
    check_registry(config)
    if egress:
        check_egress(config, asked, provision=provision and local_broker)
    return config


def check_egress(config: Config, asked: str | None = None, provision: bool = False) -> None:
    """Refuse an egress ``asked`` for that is off; provision (``provision``) and reach every egress sink turned on.

    Raises ConfigError naming the setting when an egress cannot be reached or refuses the login.
    """
    from ..pipeline.egress import configured, installed, installed_streams, settings_of, target_egress

    if asked in installed_streams() and asked not in configured(config):
        section = f"egress_{target_egress(asked).removesuffix('_egress')}"
        if asked != target_egress(asked):
            raise ConfigError(
                f"{asked}: is off: {section}.golds does not name its gold, or {section} is missing, or "
                "PIPELINE_EGRESS leaves it out"
            )
        raise ConfigError(f"{asked}: is off: its config section is missing or PIPELINE_EGRESS leaves it out")
    for egress in settings_of(config):
        module = installed()[egress]  # once per egress: it reaches each destination it publishes to
        if provision:
            module.provision_local(config)
        module.check_connection(config)


def check_registry(config: Config) -> None:
    """Reach the schema registry when a dataset names its writer schemas there (Avro): ConfigError naming
    schema_registry.url when it is not set or does not answer.
    """
    from ..pipeline.datasets import running
    from ..pipeline.formats.registry import RegistryUnavailable
    from ..pipeline.silver import schemas_for

    for dataset in running(config):
        schemas = schemas_for(config, dataset)
        if schemas is not None:
            try:
                schemas.check()
            except RegistryUnavailable as error:
                raise ConfigError(str(error)) from None
            return


def spark_session(config: Config, app: str):
    """The Spark session of a command, quiet: Spark's own INFO lines would bury the command's output.

    A lakehouse on S3 is probed first (a wrong endpoint, bucket or credential exits 2 naming it) and
    brings its connector and log store (``pipeline/session/s3.py``).
    """
    from ..pipeline.session import s3
    from ..pipeline.session.spark import build_spark

    config = resolve_local_s3(config)
    s3.prepare(config)
    packages, conf = s3.session_options(config)
    spark = build_spark(
        app_name=app,
        master=config.spark_master,
        shuffle_partitions=config.shuffle_partitions,
        ui_enabled=config.spark_ui_enabled,
        extra_conf=conf,
        extra_packages=packages,
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark
