//! What SGLang itself accepts: flag catalogs per version, and checks of manifests against them.
