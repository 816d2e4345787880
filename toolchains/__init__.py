"""Farm-side toolchains: what turns a checkpoint into evidence on a platform (see ``toolchains.base``)."""
