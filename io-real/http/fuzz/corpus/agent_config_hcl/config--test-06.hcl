client { network_interface = "nope0" }
