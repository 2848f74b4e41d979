"""The messages of a model conversation: re-exported from ``tooltrail.core.messages``.

They moved to ``tooltrail.core`` because workflow code carries them; this path stays the
provider clients' home for them.
"""

from tooltrail.core.messages import *  # noqa: F403
from tooltrail.core.messages import __all__ as __all__
