job "web" {
  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }
  affinity {
    attribute = "${meta.rack}"
    value     = "r1"
  }
  group "g" {
    constraint {
      distinct_hosts = true
    }
    constraint {
      distinct_property = "${meta.rack}"
      value             = 2
    }
    task "t" {
      driver = "raw_exec"
      resources {
        cpu        = 100
        memory     = 128
        memory_max = 256
      }
      constraint {
        attribute = "${attr.nomad.version}"
        operator  = "version"
        value     = ">= 1.0"
      }
      affinity {
        attribute = "${node.class}"
        operator  = "!="
        value     = "spot"
        weight    = -30
      }
    }
  }
}
