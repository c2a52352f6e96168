"""
A sending master's side of a transfer, for unit tests: stage JSON for a recipient and answer
``publish.runner`` pulls the way ``multimaster_transfer.pull`` does on a real master.
"""

import json

import multimaster_transport


def stage_json(sender_opts, recipient, document):
    """
    The descriptor of ``document`` staged in ``sender_opts``' outbox for ``recipient``.
    """
    return multimaster_transport.stage(sender_opts, recipient, json.dumps(document).encode())


def master_serving(sender_opts, requester):
    """
    A ``publish.runner`` stand-in: parses ``ticket=``/``offset=`` as Salt's argument parser
    would and serves the chunk to ``requester``.
    """

    def runner(fun, arg=None, timeout=5):
        assert fun == multimaster_transport.PULL
        kwargs = dict(item.split("=", 1) for item in arg)
        return multimaster_transport.serve(
            sender_opts, requester, kwargs["ticket"], int(kwargs["offset"])
        )

    return runner
