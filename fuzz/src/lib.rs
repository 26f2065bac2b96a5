//! The checks the fuzz targets make (`targets`), over functions of `reconcile` (the host-output
//! parsers beside the code that reads hosts) and of its pure core, `reconcile-core`, both linked
//! as the libraries they are.

pub mod targets;
