# Installation (`cmake --install build`) and the Debian package (`cpack -G DEB` in the
# build directory): the loom binary, the systemd units, the config file (kept if one is
# there), the README and the guides of docs/, the copyright (Apache-2.0), the Grafana dashboard.
# The package adds a `loom` system user, /var/lib/loom with the server secret, and takes its
# Depends from dpkg-shlibdeps (deploy/debian/ has the maintainer scripts; docs/operating.md
# "Install as a service" tells the rest).
include(GNUInstallDirs)

install(TARGETS loom RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The units name the installed binary, so they are written at install time, when the
# prefix is known (/usr/local for `cmake --install`, /usr in the package). systemd finds
# units under both /usr/lib and /usr/local/lib.
install(CODE "
  set(LOOM_BIN \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/loom\")
  set(LOOM_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
  foreach(unit loom-api.service loom-scheduler.service loom-executor@.service loom-gc.service)
    configure_file(\"${CMAKE_SOURCE_DIR}/deploy/systemd/\${unit}.in\" \"${CMAKE_BINARY_DIR}/systemd/\${unit}\" @ONLY)
    file(INSTALL \"${CMAKE_BINARY_DIR}/systemd/\${unit}\"
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\")
  endforeach()")
install(FILES deploy/systemd/loom-gc.timer DESTINATION lib/systemd/system)
install(FILES README.md deploy/loom.conf deploy/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
# Under docs/, as in the tree, so that the README's links to them hold.
install(FILES docs/using.md docs/operating.md docs/development.md docs/architecture.md docs/protocol.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
# The Grafana dashboard of /metrics (docs/operating.md "Metrics"), for the operator to import.
install(FILES deploy/grafana/loom.json DESTINATION ${CMAKE_INSTALL_DATADIR}/loom/grafana)
# /etc/loom/loom.conf, where every loom command looks for it (common/config.c): installed
# when absent, so that `cmake --install` never overwrites an operator's settings (the
# package lists it as a conffile, and dpkg asks).
install(CODE "
  set(conf \"\$ENV{DESTDIR}/etc/loom/loom.conf\")
  if(NOT EXISTS \"\${conf}\")
    file(INSTALL \"${CMAKE_SOURCE_DIR}/deploy/loom.conf\" DESTINATION /etc/loom
         PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ)
  else()
    message(STATUS \"Keeping: \${conf} (the new example is in ${CMAKE_INSTALL_FULL_DOCDIR}/loom.conf)\")
  endif()")

set(CPACK_PACKAGE_NAME loom)
set(CPACK_PACKAGE_VENDOR "Loom")
set(CPACK_PACKAGE_CONTACT "Loom maintainers <loom@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "multi-tenant LoRA training service (Tinker API)")
set(CPACK_PACKAGE_DESCRIPTION
    "Loom runs researchers' LoRA training and sampling operations, sent over the Tinker HTTP API,
on shared hardware: an api, a scheduler and one executor per device, with PostgreSQL as the
queue and system of record. Ships systemd units for each, a config file and a registry GC timer.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_SOURCE_DIR}/LICENSE)
set(CPACK_GENERATOR DEB)
# The package: everything but the CUDA backend module (component `cuda`), which needs the
# CUDA toolkit's libraries, no Debian package; GPU hosts install it with `cmake --install`.
set(CPACK_COMPONENTS_ALL Unspecified)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# DESTDIR staging with prefix /usr while installing: the units name /usr/bin/loom, and
# /etc/loom lands in the package. (file(INSTALL) adds DESTDIR to absolute destinations.)
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
# One host runs PostgreSQL (docs/operating.md "Several machines"); `loom up` needs its programs.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "postgresql")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/deploy/debian/postinst ${CMAKE_SOURCE_DIR}/deploy/debian/prerm
    ${CMAKE_SOURCE_DIR}/deploy/debian/postrm ${CMAKE_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
include(CPack)
