"""net/identity.py: identity files, the peer id derivation, the identity lock."""
from __future__ import annotations

import os
import stat

import pytest

from swarm_node.net import SwarmError
from swarm_node.net.identity import IdentityLock, decode_key_pb, load_or_create_identity, peer_id_of


def test_identity_file_and_peer_id(tmp_path):
    from hivemind.p2p import PeerID

    path = str(tmp_path / "node.key")
    key, raw = load_or_create_identity(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o400
    key2, raw2 = load_or_create_identity(path)
    assert raw2 == raw and key2.private_numbers() == key.private_numbers()
    assert decode_key_pb(raw)[0] == 0  # RSA
    # our peer id derivation == libp2p's (as implemented by hivemind for identity files)
    assert peer_id_of(key.public_key()) == PeerID.from_identity(raw).to_base58()
    lock = IdentityLock(path)
    with pytest.raises(SwarmError, match="already used by another running node"):
        IdentityLock(path)
    lock.release()
    IdentityLock(path).release()
    (tmp_path / "bad.key").write_bytes(b"garbage")
    with pytest.raises(SwarmError):
        load_or_create_identity(str(tmp_path / "bad.key"))
