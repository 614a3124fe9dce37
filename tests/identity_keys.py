"""Keys and tokens the identity tests mint themselves: an RSA and an EC (P-256) signing key, their JWKS, and
JWTs signed with them (or forged: `alg: none`, HS256 keyed with the public key). No identity provider."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://id.test/realms/ml"
AUDIENCE = "tritonctl"


@dataclass
class Keys:
    rsa: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(public_exponent=65537,
                                                                                     key_size=2048))
    ec: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    def jwks(self) -> dict[str, Any]:
        rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key()))
        ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key()))
        return {"keys": [{**rsa_jwk, "kid": "rsa-1", "use": "sig", "alg": "RS256"},
                         {**ec_jwk, "kid": "ec-1", "use": "sig", "alg": "ES256"}]}

    def public_pem(self) -> bytes:
        return self.rsa.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)

    def token(self, alg: str = "RS256", kid: str | None = None, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300, "sub": "u-1234",
                "email": "alice@example.com", "groups": ["ml-deployers"], **claims}
        body = {k: v for k, v in body.items() if v is not None}
        if alg == "RS256":
            return jwt.encode(body, self.rsa, algorithm=alg, headers={"kid": kid or "rsa-1"})
        if alg == "ES256":
            return jwt.encode(body, self.ec, algorithm=alg, headers={"kid": kid or "ec-1"})
        if alg == "none":  # unsigned: what an attacker sends hoping the check is skipped
            return ".".join((_b64({"alg": "none", "typ": "JWT", "kid": kid or "rsa-1"}), _b64(body), ""))
        if alg == "HS256":  # "signed" with the public key as an HMAC secret: the algorithm confusion attack
            import hashlib
            import hmac

            signing = ".".join((_b64({"alg": "HS256", "typ": "JWT", "kid": kid or "rsa-1"}), _b64(body)))
            mac = hmac.new(self.public_pem(), signing.encode(), hashlib.sha256).digest()
            return f"{signing}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
        raise ValueError(alg)


def _b64(document: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()
