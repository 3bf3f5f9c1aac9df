// Placeholder for a layer folder that has no source yet.
