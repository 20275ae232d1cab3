"""What makes `kafka-local start --secure` a broker that demands security.

A private CA with a broker and a client certificate (made once per broker home with the
`cryptography` package), the broker settings of a SASL_SSL listener (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512) and of an SSL listener that requires a client certificate, and the SCRAM
user. Passwords live in owner-only files; nothing here prints one.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

# The one SASL user of a secure broker; it authenticates with PLAIN and both SCRAM mechanisms.
SECURE_USER = "pipeline"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
_SCRAM_ITERATIONS = 8192
_CERT_DAYS = 3650


@dataclass(frozen=True)
class SecureFiles:
    """What a client of a secure local broker needs; secrets are only ever file paths here."""

    directory: Path
    ca: Path
    client_certificate: Path
    client_key: Path
    sasl_password_file: Path
    broker_keystore: Path
    broker_keystore_password_file: Path
    user: str = SECURE_USER


def secure_files(directory: Path) -> SecureFiles:
    """The file layout of a certificate directory (whether or not it exists yet).

    Example::

        files = secure_files(Path(".kafka-local/secure"))
        print(files.ca)
    """
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(f"directory must be a path, not {type(directory).__name__}")
    directory = Path(directory).resolve()
    return SecureFiles(
        directory=directory,
        ca=directory / "ca.pem",
        client_certificate=directory / "client.pem",
        client_key=directory / "client-key.pem",
        sasl_password_file=directory / "sasl.password",
        broker_keystore=directory / "broker.p12",
        broker_keystore_password_file=directory / "broker.password",
    )


def create_certificates(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> SecureFiles:
    """A private CA, a broker certificate for ``hosts`` and a client certificate, once per directory.

    The CA's own key is not kept: nothing else is ever signed with it. Files holding a
    key or a password are readable by their owner only.

    Example::

        files = create_certificates(Path("/tmp/other-ca"))   # e.g. a CA the broker does not trust
        print(files.ca.read_text())
    """
    if not hosts or not all(isinstance(host, str) and host for host in hosts):
        raise ValueError(f"hosts must name at least one host or IP address, not {hosts!r}")
    files = secure_files(directory)
    marker = files.directory / "complete"
    if marker.exists():
        return files
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import pkcs12
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise RuntimeError(
            "kafka-local --secure generates its certificates with the 'cryptography' package: "
            "pip install cryptography (it is in the [dev] extra)"
        ) from None
    import datetime
    import ipaddress

    files.directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=_CERT_DAYS)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def certificate(subject: str, key, issuer: str, issuer_key, extensions: list) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_name = f"kafka-local CA {secrets.token_hex(4)}"
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate(
        ca_name,
        ca_key,
        ca_name,
        ca_key,
        [
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (x509.KeyUsage(False, False, False, False, False, True, True, False, False), True),
        ],
    )
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = certificate(
        "kafka-local broker",
        broker_key,
        ca_name,
        ca_key,
        [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.SubjectAlternativeName(sans), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = certificate(
        SECURE_USER,
        client_key,
        ca_name,
        ca_key,
        [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False),
        ],
    )
    pem = serialization.Encoding.PEM
    broker_password = secrets.token_urlsafe(24)
    write_owner_only(files.broker_keystore_password_file, broker_password.encode())
    write_owner_only(
        files.broker_keystore,
        pkcs12.serialize_key_and_certificates(
            b"broker",
            broker_key,
            broker,
            [ca],
            serialization.BestAvailableEncryption(broker_password.encode()),
        ),
    )
    # PKCS#8, the form both the JVM client and librdkafka read. Unencrypted (owner-only), as
    # client keys usually are: the JVM cannot decrypt the PBES2 encryption made here.
    write_owner_only(
        files.client_key,
        client_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    write_owner_only(files.sasl_password_file, secrets.token_urlsafe(24).encode())
    files.client_certificate.write_bytes(client.public_bytes(pem) + ca.public_bytes(pem))
    files.ca.write_bytes(ca.public_bytes(pem))
    marker.write_text("")
    return files


def write_owner_only(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable and writable by its owner only.

    Example::

        write_owner_only(Path(".kafka-local/secure/sasl.password"), b"...")
    """
    if not isinstance(data, bytes):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    # Created 0600 rather than chmod-ed after writing, so the secret is never world-readable;
    # an existing file keeps its mode, so it is set again.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def client_state(files: SecureFiles, sasl_ssl_port: int, mtls_port: int) -> dict:
    """What a client of the secure listeners needs: addresses, user and file paths, no secret.

    Example::

        client_state(secure_files(home / "secure"), 9093, 9094)["sasl_ssl"]   # '127.0.0.1:9093'
    """
    if not isinstance(files, SecureFiles):
        raise TypeError(f"files must be SecureFiles, not {type(files).__name__}")
    return {
        "sasl_ssl": f"127.0.0.1:{int(sasl_ssl_port)}",
        "mtls": f"127.0.0.1:{int(mtls_port)}",
        "sasl_mechanisms": list(SASL_MECHANISMS),
        "user": files.user,
        "sasl_password_file": str(files.sasl_password_file),
        "ca": str(files.ca),
        "client_certificate": str(files.client_certificate),
        "client_key": str(files.client_key),
    }


def broker_settings(files: SecureFiles) -> dict[str, str]:
    """server.properties lines of the SASL_SSL and MTLS listeners (the file must be owner-only).

    Example::

        settings.update(broker_settings(create_certificates(home / "secure")))
    """
    if not isinstance(files, SecureFiles):
        raise TypeError(f"files must be SecureFiles, not {type(files).__name__}")
    password = files.sasl_password_file.read_text()
    return {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(files.broker_keystore),
        "ssl.keystore.password": files.broker_keystore_password_file.read_text(),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        # Mutual TLS on its own listener; SASL_SSL clients need no certificate.
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        # PLAIN users live in the JAAS config; SCRAM users in the cluster metadata.
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{files.user}="{password}";'
        ),
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
    }


def create_scram_users(plaintext_bootstrap: str, files: SecureFiles) -> dict:
    """Create (or reset) the SCRAM user for both mechanisms; return a client config that logs in as it.

    Upserted on every start over the plaintext listener (no authorizer runs here), so a data
    directory formatted by a plain start gets its user too.

    Example::

        login = create_scram_users("127.0.0.1:9092", files)   # then AdminClient(login).list_topics()
    """
    if not plaintext_bootstrap or not isinstance(plaintext_bootstrap, str):
        raise ValueError(f"plaintext_bootstrap must be host:port, not {plaintext_bootstrap!r}")
    password = files.sasl_password_file.read_bytes()
    admin = AdminClient({"bootstrap.servers": plaintext_bootstrap, "log_level": 0})
    for mechanism in _SCRAM.values():
        # One request per mechanism: the broker refuses two changes to a user in one request.
        upsert = UserScramCredentialUpsertion(files.user, ScramCredentialInfo(mechanism, _SCRAM_ITERATIONS), password)
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": files.user,
        "sasl.password": password.decode(),
        "ssl.ca.location": str(files.ca),
    }


def client_instructions(secure: dict) -> str:
    """The lines `kafka-local start --secure` prints: addresses, paths and `export` lines.

    Example::

        print(client_instructions(LocalKafka(home).secure_listeners()))
    """
    missing = {"sasl_ssl", "mtls", "user", "ca", "client_certificate", "client_key", "sasl_password_file"} - set(secure)
    if missing:
        raise ValueError(f"secure listener state lacks {sorted(missing)}")
    # Paths only: the passwords stay in their files, which the config names.
    common = f"KAFKA_SSL_CA_LOCATION={secure['ca']}"
    return "\n".join(
        [
            f"SASL_SSL        {secure['sasl_ssl']}  user {secure['user']}, "
            f"mechanisms {' '.join(secure['sasl_mechanisms'])}",
            f"SSL (mutual)    {secure['mtls']}  client certificate required",
            f"CA certificate  {secure['ca']}",
            f"client cert     {secure['client_certificate']}",
            f"client key      {secure['client_key']}",
            f"SASL password   in {secure['sasl_password_file']}",
            "connect with SCRAM:",
            f"  export KAFKA_BOOTSTRAP_SERVERS={secure['sasl_ssl']} KAFKA_SECURITY_PROTOCOL=SASL_SSL "
            f"KAFKA_SASL_MECHANISM=SCRAM-SHA-512 KAFKA_SASL_USERNAME={secure['user']} "
            f"KAFKA_SASL_PASSWORD_FILE={secure['sasl_password_file']} {common}",
            "connect with mutual TLS:",
            f"  export KAFKA_BOOTSTRAP_SERVERS={secure['mtls']} KAFKA_SECURITY_PROTOCOL=SSL {common} "
            f"KAFKA_SSL_CERTIFICATE_LOCATION={secure['client_certificate']} "
            f"KAFKA_SSL_KEY_LOCATION={secure['client_key']}",
        ]
    )
