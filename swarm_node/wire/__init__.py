"""The wire layer: what a packet is, byte for byte (protocol/SPEC.md), and the task contract.

    codec.py        Packet <-> canonical msgpack bytes, strict validation, digests
    packet_json.py  the JSON form of a packet (`swarm-node protocol decode|encode`)
    conformance.py  the conformance vectors' cases and outcomes, runner-independent
    contract.py     the task contract: run manifest (announced digest), task vectors (SPEC section 14)
    schedule.py     which problems a producer answers in a round (SPEC section 14.5)

May import the base and tasks/ (the contract renders prompts). Must not import net/, train/,
swarm/, node.py or commands/: a third party's node is written from this layer's spec alone.
"""
