"""Capture: turn live OpenAI API traffic into a replayable hash-id trace (``replayer record``,
``replayer trace from-log``), storing no prompt text, token ids or image bytes.

``rows`` (request body -> facts; the capture schema), ``blocks`` (keyed chained block hashes,
compact ids), ``tokenize`` (token ids after the request, bounded queue), ``offload`` (its worker
process and the loop's socket to it), ``proxy`` (the reverse proxy: ``downstream`` clients,
``relay`` upstream, ``usage``, ``poll``), ``writer`` (Parquet parts and rolls), ``metrics``,
``record`` (the command; ``recordflags`` its flags), ``fromlog`` (gateway logs -> the same rows).
"""
