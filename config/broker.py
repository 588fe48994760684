"""The embedded Celery broker: kombu's file-system transport with messages written atomically.

kombu's own ``_put`` creates the message file under its final name and then writes it, while a
consumer moves a message file away as soon as it lists it: a fast consumer can take the file
while it is still empty and fail to decode it, which stops the worker (seen in CI: a fault
reported through the API was never handled). Here a message is written under a name the
consumer never picks (a leading dot) and renamed into place when complete.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put a message onto ``queue``: written in full, then renamed to its queue name."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{uuid.uuid4()}.partial")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)  # atomic within one directory
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
