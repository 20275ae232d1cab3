"""The lakehouse on S3: Spark's S3A settings, safe Delta commits there, and a probe before Spark starts.

A lakehouse root ``s3a://bucket/prefix`` brings three things; a local or HDFS root brings none of them:

* Hadoop's S3A connector, ``hadoop-aws`` at exactly the Hadoop version pyspark ships, with the AWS SDK
  modules it calls, fetched from Maven Central like the other jars. Not the SDK's "bundle" jar that
  hadoop-aws depends on: at 686 MB, Spark copies it into every process's work directory (a killed
  driver leaves the copy behind) and ships it to every executor; the modules weigh about 16 MB.
* Delta's log store for S3 replaced by ``S3ConditionalPutLogStore`` (``jvm/``, built into this package's
  ``jars/`` by `make install`). Delta commits version N by creating ``_delta_log/N.json`` only if it is
  absent; Delta's default S3 store checks and then uploads, so two processes committing the same
  version both succeed and the later upload silently replaces the earlier commit. This store uploads
  with ``If-None-Match: *`` (S3A's conditional create), so the loser gets the conflict Delta retries on.
  The store must honour conditional writes: AWS S3 does (since 2024), as do SeaweedFS and MinIO.
* A probe (``check``) before Spark starts: one signed request listing at most one key under the root,
  so a wrong endpoint, region, bucket or credential exits 2 naming its setting within seconds, where
  S3A would retry for minutes.

Credentials never enter Spark's configuration (which Spark writes to event logs and shows in its UI):
S3A's default chain reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the driver's environment (or
an instance or pod role); ``s3.credentials_file`` is read into that environment before the JVM starts.

The probe signs its one request itself (AWS Signature Version 4, with hashlib and hmac, in
``sign_request``; the development server ``s3-local`` uses it too): the AWS SDK for Python would be a
14 MB dependency for a handful of requests.
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import hmac
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from importlib import resources
from pathlib import Path

import pyspark

from ..config import LOCAL_ENDPOINT, Config, ConfigError, S3Section

SCHEME = "s3a://"
# The Java class of jvm/ and the jar `make install` builds from it (see jvm/pom.xml).
# The project's top package: the log store's Java package and its jar are named after it.
PROJECT_PACKAGE = __package__.split(".")[0]
LOG_STORE_CLASS = f"{PROJECT_PACKAGE}.storage.S3ConditionalPutLogStore"
LOG_STORE_JAR = "s3-conditional-log-store.jar"
PROBE_TIMEOUT_S = 10.0
# The AWS SDK v2 version hadoop-aws 3.5.0 is built against (its pom's software.amazon.awssdk:bundle):
# change it with pyspark's Hadoop version. S3A calls S3, its transfer manager, and STS for assumed roles.
AWS_SDK_VERSION = "2.35.4"
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
AWS_SDK_BUNDLE = "software.amazon.awssdk:bundle"
DEFAULT_REGION = "us-east-1"


def is_s3(root: str) -> bool:
    """Whether the lakehouse root is on S3 (an ``s3a://`` URI)."""
    return root.lower().startswith(SCHEME)


def bucket_and_prefix(root: str) -> tuple[str, str]:
    """``("bucket", "prefix/")`` of an ``s3a://bucket/prefix`` root ("" for the bucket's top).

    Example::

        bucket_and_prefix("s3a://lake/clickstream")  # ("lake", "clickstream/")
    """
    if not isinstance(root, str) or not is_s3(root):
        raise ValueError(f"root must be an s3a:// URI, not {root!r}")
    bucket, _, prefix = root[len(SCHEME) :].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def hadoop_aws_package() -> str:
    """The Maven coordinates of ``hadoop-aws`` matching the Hadoop client jars of the installed pyspark."""
    jars = Path(pyspark.__file__).parent / "jars"
    pattern = re.compile(r"hadoop-client-api-(\d[\w.]*)\.jar")
    matches = (pattern.fullmatch(jar.name) for jar in jars.glob("hadoop-client-api-*.jar"))
    versions = sorted(match.group(1) for match in matches if match)
    if not versions:
        raise RuntimeError(f"no hadoop-client-api jar in {jars}: cannot pick the hadoop-aws version")
    return f"org.apache.hadoop:hadoop-aws:{versions[-1]}"


def log_store_jar() -> Path:
    """Where `make install` puts the conditional-write log store's jar (it may not be built yet)."""
    return Path(str(resources.files(PROJECT_PACKAGE) / "jars" / LOG_STORE_JAR))


def connector_options() -> tuple[list[str], dict[str, str]]:
    """(Maven packages, Spark settings) of the S3A connector and the conditional-write log store.

    Example::

        packages, conf = connector_options()
        build_spark("tests", extra_packages=packages, extra_conf=conf)
    """
    packages = [
        hadoop_aws_package(),
        *(f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}" for module in AWS_SDK_MODULES),
    ]
    return packages, {"spark.jars.excludes": AWS_SDK_BUNDLE, **log_store_conf()}


def log_store_conf() -> dict[str, str]:
    """Spark settings that make Delta commit to s3a:// paths with conditional writes (``S3ConditionalPutLogStore``).

    Raises ConfigError, naming the way out, when the jar is not built.

    Example::

        build_spark("tests", extra_conf=log_store_conf())  # with connector_options()'s packages
    """
    jar = log_store_jar()
    if not jar.is_file():
        raise ConfigError(
            f"lakehouse.root: a lakehouse on S3 needs the conditional-write Delta log store ({jar} is missing): "
            "build it with `make install` (or `mvn -q -f jvm/pom.xml package`)"
        )
    return {
        "spark.jars": str(jar),
        "spark.delta.logStore.s3a.impl": LOG_STORE_CLASS,
        # S3A's conditional create (If-None-Match), on by default in Hadoop 3.5: said, not assumed.
        "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
    }


def session_options(config: Config) -> tuple[list[str], dict[str, str]]:
    """(extra Maven packages, Spark settings) that a session over ``config``'s lakehouse needs; none off S3.

    Example::

        packages, conf = session_options(config)
        build_spark("run", extra_packages=packages, extra_conf=conf)
    """
    if not is_s3(config.lakehouse_root):
        return [], {}
    settings = config.s3
    if settings.endpoint == LOCAL_ENDPOINT:
        raise ConfigError("s3.endpoint: is 'local' but was not resolved to the running `s3-local` server")
    packages, connector_conf = connector_options()
    conf = {
        **connector_conf,
        "spark.hadoop.fs.s3a.endpoint.region": settings.region,
        "spark.hadoop.fs.s3a.path.style.access": str(settings.path_style_access).lower(),
    }
    if settings.endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = settings.endpoint
    return packages, conf


def prepare(config: Config, environ: dict[str, str] | None = None) -> None:
    """Before Spark starts on an S3 lakehouse: credentials into the environment, then ``check``.

    ``environ`` (default os.environ, which the JVM inherits) receives AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY from ``s3.credentials_file`` when the config names one. Raises ConfigError
    naming the setting that is wrong. Nothing happens for a lakehouse off S3.
    """
    if not is_s3(config.lakehouse_root):
        return
    environ = os.environ if environ is None else environ
    if config.s3.credentials_file:
        access_key, secret_key = read_credentials_file(config.s3.credentials_file)
        environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"] = access_key, secret_key
        environ.pop("AWS_SESSION_TOKEN", None)
    check(config, environ)


def read_credentials_file(location: str | os.PathLike) -> tuple[str, str]:
    """(access key id, secret) of the ``[default]`` profile of an AWS shared-credentials file.

    Raises ConfigError naming ``s3.credentials_file`` when the file or a key is missing.

    Example::

        access_key, secret = read_credentials_file("~/.aws/credentials")
    """
    path = Path(location).expanduser()
    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"s3.credentials_file: {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, configparser.Error) as error:
        raise ConfigError(f"s3.credentials_file: {str(path)!r} cannot be read: {error.__class__.__name__}") from None
    profile = parser["default"] if parser.has_section("default") else {}
    missing = [key for key in ("aws_access_key_id", "aws_secret_access_key") if not profile.get(key, "").strip()]
    if missing:
        raise ConfigError(f"s3.credentials_file: {str(path)!r} has no {' or '.join(missing)} in its [default] profile")
    return profile["aws_access_key_id"].strip(), profile["aws_secret_access_key"].strip()


def check(config: Config, environ: dict[str, str] | None = None) -> None:
    """List at most one key under the S3 root with the configured credentials; ConfigError names what is wrong.

    Without credentials in the environment (an instance or pod role), only the endpoint is reached:
    the role's answer comes from S3A itself when Spark starts.
    """
    environ = os.environ if environ is None else environ
    bucket, prefix = bucket_and_prefix(config.lakehouse_root)
    url = f"{_bucket_url(config.s3, bucket)}?list-type=2&max-keys=1&prefix={urllib.parse.quote(prefix, safe='')}"
    credentials = (environ.get("AWS_ACCESS_KEY_ID", ""), environ.get("AWS_SECRET_ACCESS_KEY", ""))
    try:
        if not all(credentials):
            with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S):
                return
        token = environ.get("AWS_SESSION_TOKEN")
        headers = {"x-amz-security-token": token} if token else None
        status, _, body = s3_request(
            "GET", url, credentials, headers=headers, timeout=PROBE_TIMEOUT_S, region=config.s3.region
        )
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return  # unsigned: S3 answered; the role's own check comes when Spark starts
        status, body = error.code, error.read(4096)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConfigError(f"s3.endpoint: {url.partition('?')[0]} cannot be reached: {reason}") from None
    if status >= 300:
        match = re.search(rb"<Code>([^<]+)</Code>", body)
        code = match.group(1).decode("utf-8", "replace") if match else ""
        raise ConfigError(_refusal(config, bucket, status, code))


def sign_request(
    method: str,
    url: str,
    credentials: tuple[str, str],
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    region: str = DEFAULT_REGION,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """The headers of an S3 request signed with AWS Signature Version 4, ``headers`` included.

    A few dozen lines instead of an SDK dependency (boto3/botocore) for the handful of requests the
    start-up probe, the development server and its tests make. Every header given is signed. Send
    the request to ``encode_url(url)``: the path and query exactly as signed.

    Example::

        headers = sign_request("PUT", "http://127.0.0.1:38333/lakehouse", read_credentials_file(path))
    """
    access_key, secret_key = credentials
    parts = urllib.parse.urlsplit(encode_url(url))
    now = now or datetime.datetime.now(datetime.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    signed = {key.lower(): " ".join(str(value).split()) for key, value in (headers or {}).items()}
    signed.update(
        {"host": parts.netloc, "x-amz-date": amz_date, "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    )
    names = sorted(signed)
    canonical = "\n".join(
        [
            method.upper(),
            parts.path,
            parts.query,
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            signed["x-amz-content-sha256"],
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    credential = f"Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    return {
        **{name: signed[name] for name in names if name != "host"},
        "authorization": f"AWS4-HMAC-SHA256 {credential}",
    }


def encode_url(url: str) -> str:
    """``url`` with its path and query in SigV4's canonical form: percent-encoded once, the query sorted.

    Keys may be given plain or percent-encoded (then a literal "%" must be "%25").

    Example::

        encode_url("http://127.0.0.1:38333/lakehouse/a b.txt")  # ".../lakehouse/a%20b.txt"
    """

    def quote(text: str, safe: str = "-_.~") -> str:
        return urllib.parse.quote(urllib.parse.unquote(text), safe=safe)

    parts = urllib.parse.urlsplit(url)
    pairs = sorted(
        (quote(name), quote(value)) for name, _, value in (p.partition("=") for p in parts.query.split("&") if p)
    )
    query = "&".join(f"{name}={value}" for name, value in pairs)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, quote(parts.path or "/", "/-_.~"), query, ""))


def s3_request(
    method: str,
    url: str,
    credentials: tuple[str, str],
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    region: str = DEFAULT_REGION,
) -> tuple[int, dict[str, str], bytes]:
    """Send one signed request; return status, headers (names in lower case) and body, 4xx and 5xx included.

    Example::

        status, _, _ = s3_request("PUT", f"{endpoint}/lakehouse/a.txt", credentials, b"hi", {"If-None-Match": "*"})
    """
    data = body if body or method.upper() in ("PUT", "POST") else None
    headers = dict(headers or {})
    if data is not None and not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/octet-stream"  # urllib would send a form's type
    request = urllib.request.Request(encode_url(url), data=data, method=method.upper())
    for name, value in sign_request(method, url, credentials, headers, body, region).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, _lower(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, _lower(error.headers), error.read()


def _bucket_url(settings: S3Section, bucket: str) -> str:
    """The bucket's URL, path-style (https://host/bucket) or virtual-host-style (https://bucket.host/)."""
    endpoint = settings.endpoint or f"https://s3.{settings.region}.amazonaws.com"
    parts = urllib.parse.urlsplit(endpoint)
    if settings.path_style_access:
        return f"{parts.scheme}://{parts.netloc}/{bucket}"
    return f"{parts.scheme}://{bucket}.{parts.netloc}/"


def _lower(headers) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _refusal(config: Config, bucket: str, status: int, code: str) -> str:
    """The message of a refused probe: the setting to look at first, then what S3 answered."""
    answer = f"S3 answered {status} {code}".rstrip()
    if config.s3.credentials_file:
        setting = f"s3.credentials_file: the credentials in {config.s3.credentials_file}"
    else:
        setting = "AWS_ACCESS_KEY_ID: the credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}:
        return f"{setting} are refused ({answer})"
    if code == "NoSuchBucket" or status == 404:
        where = config.s3.endpoint or "AWS"
        return f"lakehouse.root: bucket {bucket!r} does not exist at {where} ({answer}); create it first"
    if code in {"AuthorizationHeaderMalformed", "PermanentRedirect"} or status == 301:
        return f"s3.region: {config.s3.region!r} is not the bucket's region ({answer})"
    if status == 403:
        return f"{setting} may not list {config.lakehouse_root} ({answer})"
    return f"s3.endpoint: {config.s3.endpoint or 'AWS'} refused the probe of {config.lakehouse_root} ({answer})"
