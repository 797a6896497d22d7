"""The records the engine's rooms share (tests/test_structure.py::ROOMS): a request and what it
reports (request.py), and the contract of a per-request logits constraint (constraint.py) that the
constrained-decoding room implements. Above kv/ (a request runs on a KV sequence), below
constrain/, scheduling/ and engine/, which all read and write requests."""
