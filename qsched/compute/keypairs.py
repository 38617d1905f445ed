"""Keypairs: create (generated), import, list, show and delete, per user, as Nova's.

No HTTP here: :mod:`qsched.api.keypairs` parses, calls one method of the front
door's :class:`qsched.compute.parts.Keypairs` (which runs :class:`KeypairAPI`, one
cell's keypairs, in each cell) and renders. Every call is O(1) ledger work (a listing reads
one user's keypairs, at most ``[quota] key_pairs`` of them). The rules are
Nova's ``os_compute_api:os-keypairs:*`` on the target ``{"user_id": ...}``:
the owner, or an admin acting for another user (``user_id``, from 2.10).

Generated keys are made here with ``cryptography``: an RSA ssh key (the private
key in PEM, returned once, never kept) or, for ``x509``, a self-signed client
certificate as Nova makes for WinRM (the private key as a base64 PKCS#12 with
an empty password). Fingerprints are Nova's: the colon-separated MD5 of an ssh
key's blob, the colon-separated SHA-1 of a certificate.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import hashlib
import re

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from qsched import exception
from qsched.compute.quotas import QuotaAPI
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import SSH, X509, Keypair
from qsched.policies import keypairs as keypairs_policy
from qsched.policy import Policy
from qsched.scheduling.records import ServerFields

TYPES = (SSH, X509)
#: Nova's keypair names (``keypair_name_special_chars``, up to 2.91)
NAME = re.compile(r"(?=.{1,255}$)[_\-a-zA-Z0-9](?:[_\- a-zA-Z0-9]*[_\-a-zA-Z0-9])?", re.DOTALL)
_KEY_BITS = 2048
_UPN_OID = x509.ObjectIdentifier("1.3.6.1.4.1.311.20.2.3")  # Microsoft's user principal name


class InvalidKeyName(exception.Invalid):
    """A boot's ``key_name`` is none of the caller's keypairs (Nova's 400)."""

    msg_fmt = "Invalid key_name provided."


class KeypairAPI:
    """The keypairs of a cell's users, under ``policy``."""

    def __init__(self, stores: Stores, policy: Policy, quotas: QuotaAPI | None = None) -> None:
        self.keypairs = stores.keypairs
        self.policy = policy
        self.quotas = quotas or QuotaAPI(stores, policy)

    def generate(
        self, context: RequestContext, name: str, key_type: str = SSH, user_id: str | None = None
    ) -> tuple[Keypair, str]:
        """A new keypair for ``user_id`` (default: the caller) and its private key; nothing
        is kept here (:meth:`qsched.compute.parts.Keypairs.create` keeps the one record in
        every cell).

        :raises Invalid: a name outside Nova's rules, an unknown type.
        :raises Forbidden: the rule refuses the caller for that user (403).
        """
        owner = self._authorized(context, "create", user_id)
        _check_name(name)
        _check_type(key_type)
        if key_type == SSH:
            private_key, public_key, fingerprint = generate_ssh_key()
        else:
            private_key, public_key, fingerprint = generate_x509_cert(owner)
        return Keypair(owner, name, public_key, fingerprint, key_type), private_key

    def imported(
        self,
        context: RequestContext,
        name: str,
        public_key: str,
        key_type: str = SSH,
        user_id: str | None = None,
    ) -> Keypair:
        """The keypair of a public key (ssh) or certificate (x509, PEM) given by the
        caller; nothing is kept here (:meth:`qsched.compute.parts.Keypairs.import_public_key`).

        :raises InvalidKeypair: the key does not parse (400, Nova's words).
        :raises Invalid, Forbidden: as :meth:`generate`.
        """
        owner = self._authorized(context, "create", user_id)
        _check_name(name)
        _check_type(key_type)
        fingerprint = (
            ssh_fingerprint(public_key) if key_type == SSH else x509_fingerprint(public_key)
        )
        return Keypair(owner, name, public_key, fingerprint, key_type)

    def keep(self, context: RequestContext, keypair: Keypair) -> Keypair:
        """Store ``keypair`` within the ``key_pairs`` quota of the caller's project (its
        own limit, set through ``os-quota-sets``, or the default), as Nova counts it.

        :raises KeypairExists: the user has one of that name (409).
        :raises KeypairLimitExceeded: the user holds the ``key_pairs`` quota of the caller's
            project already (403).
        """
        return self.keypairs.create(keypair, self.quotas.limit_for(context.project_id, "key_pairs"))

    def get(self, context: RequestContext, name: str, user_id: str | None = None) -> Keypair:
        """One keypair of ``user_id`` (default: the caller).

        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises KeypairNotFound: none of that name (404).
        """
        owner = self._authorized(context, "show", user_id)
        return self._get(owner, name)

    def for_boot(self, context: RequestContext, fields: ServerFields) -> ServerFields:
        """``fields`` of a boot with the public key of its ``key_name`` (the caller's own
        keypair, as Nova looks it up: no rule is asked).

        :raises InvalidKeyName: the caller has no keypair of that name (400).
        """
        if fields.key_name is None:
            return fields
        try:
            keypair = self._get(context.user_id, fields.key_name)
        except exception.KeypairNotFound:
            raise InvalidKeyName() from None
        return dataclasses.replace(fields, key_data=keypair.public_key)

    def list(
        self,
        context: RequestContext,
        user_id: str | None = None,
        limit: int | None = None,
        marker: str | None = None,
    ) -> list[Keypair]:
        """The keypairs of ``user_id`` (default: the caller) by name: at most ``limit``,
        those after the one named ``marker``.

        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises MarkerCouldNotBeFound: the user has no keypair named ``marker`` (400).
        """
        owner = self._authorized(context, "index", user_id)
        found = self.keypairs.list_user(owner)
        if marker is not None:
            names = [k.name for k in found]
            if marker not in names:
                raise exception.MarkerCouldNotBeFound(marker=printable(marker))
            found = found[names.index(marker) + 1 :]
        return found if limit is None else found[:limit]

    def delete(self, context: RequestContext, name: str, user_id: str | None = None) -> None:
        """Forget one keypair of ``user_id`` (default: the caller).

        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises KeypairNotFound: none of that name (404).
        """
        owner = self._authorized(context, "delete", user_id)
        self.keypairs.delete(owner, _lookup_name(owner, name))

    def _get(self, owner: str, name: str) -> Keypair:
        return self.keypairs.get(owner, _lookup_name(owner, name))

    def _authorized(self, context: RequestContext, action: str, user_id: str | None) -> str:
        owner = user_id or context.user_id
        _check_user(owner)
        self.policy.authorize(context, keypairs_policy.POLICY_ROOT % action, {"user_id": owner})
        return owner


def _lookup_name(owner: str, name: str) -> str:
    """``name``, if a keypair may have it (no need to ask the ledger otherwise).

    :raises KeypairNotFound: it may not.
    """
    if not NAME.fullmatch(name):
        raise exception.KeypairNotFound(name=printable(name), user_id=owner)
    return name


def _check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise exception.InvalidKeypair(
            reason="Keypair name must be 1 to 255 of letters, digits, spaces, '_' and '-', "
            "without leading or trailing spaces"
        )


def _check_type(key_type: str) -> None:
    if key_type not in TYPES:
        raise exception.Invalid(reason=f"keypair type must be one of {list(TYPES)}")


def _check_user(user_id: str) -> None:
    if not 0 < len(user_id) <= 255 or not user_id.isprintable() or _has_surrogate(user_id):
        raise exception.Invalid(reason="user_id must be 1 to 255 printable characters")


def printable(text: str, limit: int = 100) -> str:
    """``text`` as an error message may show it: surrogates escaped, at most ``limit``."""
    shown = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def ssh_fingerprint(public_key: str) -> str:
    """Nova's fingerprint of an OpenSSH public key: MD5 of its blob, ``aa:bb:...``.

    :raises InvalidKeypair: not a public key ``cryptography`` can load.
    """
    try:
        serialization.load_ssh_public_key(public_key.encode("utf-8"))
        blob = base64.b64decode(public_key.split(" ")[1])
    except (ValueError, IndexError, UnicodeError, binascii.Error, TypeError,
            UnsupportedAlgorithm) as exc:  # fmt: skip
        raise exception.InvalidKeypair(reason="failed to generate fingerprint") from exc
    return _colons(hashlib.md5(blob, usedforsecurity=False).hexdigest())


def x509_fingerprint(pem: str) -> str:
    """Nova's fingerprint of a PEM certificate: SHA-1 of it, ``aa:bb:...``.

    :raises InvalidKeypair: not a PEM certificate.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem.encode("utf-8"))
    except (ValueError, TypeError, UnicodeError) as exc:
        raise exception.InvalidKeypair(
            reason=f"failed to generate X509 fingerprint. Error message: {exc}"
        ) from exc
    return _colons(cert.fingerprint(hashes.SHA1()).hex())  # Nova's form (not for security)


def _colons(hex_digest: str) -> str:
    return ":".join(hex_digest[i : i + 2] for i in range(0, len(hex_digest), 2))


def generate_ssh_key() -> tuple[str, str, str]:
    """A new RSA key: its private key (PEM), public key (OpenSSH) and fingerprint."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=_KEY_BITS)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode("ascii")
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    public_key = f"{public.decode('ascii')} Generated-by-qsched\n"
    return private, public_key, ssh_fingerprint(public_key)


def generate_x509_cert(user_id: str) -> tuple[str, str, str]:
    """A self-signed client certificate for ``user_id``, as Nova's for WinRM: its private
    key (base64 PKCS#12, empty password), the certificate (PEM) and its fingerprint."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=_KEY_BITS)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user_id[:64])])
    now = datetime.datetime.now(datetime.UTC)
    upn = x509.OtherName(_UPN_OID, _der_utf8(f"{user_id}@localhost"))
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([upn]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    bundle = pkcs12.serialize_key_and_certificates(
        None, key, cert, None, serialization.NoEncryption()
    )
    return base64.b64encode(bundle).decode("ascii"), pem, x509_fingerprint(pem)


def _der_utf8(text: str) -> bytes:
    """``text`` as a DER UTF8String (what an otherName's value is)."""
    raw = text.encode("utf-8")
    size = len(raw)
    if size < 0x80:
        return bytes([0x0C, size]) + raw
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([0x0C, 0x80 | len(length)]) + length + raw
