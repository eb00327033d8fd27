"""The env service wire contract: env.proto and its generated Python code (regenerate with
`python -m protos.generate`; never edit the *_pb2* files by hand)."""
