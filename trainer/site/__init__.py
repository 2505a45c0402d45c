"""The site a run controls: a CityLearn dataset resolved once into a :class:`Site` and carried, never re-read."""

from trainer.site.kinds import BUILT_IN, NAMED, SCHEMA, SITE_KINDS, SiteKind
from trainer.site.site import HeldOut, Site, given_site

__all__ = ["BUILT_IN", "NAMED", "SCHEMA", "SITE_KINDS", "HeldOut", "Site", "SiteKind", "given_site"]
