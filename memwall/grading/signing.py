"""Sign the per-cell results, so student code cannot forge them.

The results file's path is on pytest's command line, which the kernel (a child of pytest) can
read. So the grader also hands pytest a one-time key, in a file that the plugin reads and deletes
before the kernel starts, and every record carries an HMAC made with it. The grader drops any
record whose signature does not check out.
"""

import hashlib
import hmac
import json

SIGNATURE_KEY = "signature"


def sign(key: bytes, record: dict) -> dict:
    payload = json.dumps(record, sort_keys=True).encode()
    return {**record, SIGNATURE_KEY: hmac.new(key, payload, hashlib.sha256).hexdigest()}


def verify(key: bytes, signed: dict):
    """The record without its signature, or None when the signature is missing or wrong."""
    if not isinstance(signed, dict):
        return None
    record = {name: value for name, value in signed.items() if name != SIGNATURE_KEY}
    expected = sign(key, record)[SIGNATURE_KEY]
    return record if hmac.compare_digest(expected, str(signed.get(SIGNATURE_KEY, ""))) else None
