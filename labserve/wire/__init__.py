"""What travels on the wire: body codecs and the Open Inference Protocol's datatypes.

Framework-neutral (no tornado): the server decodes with it, the load generator encodes.
"""

__all__: list[str] = []
