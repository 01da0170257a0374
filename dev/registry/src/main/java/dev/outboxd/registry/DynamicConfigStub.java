package dev.outboxd.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.ArrayList;
import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

/**
 * Stands in for the build step of apicurio-common-app-components-config-index,
 * whose -deployment artifact is not on this Maven Central mirror: it would fill
 * this list with the @Dynamic config properties; an empty list disables them.
 */
@Singleton
public class DynamicConfigStub {
    @Produces
    @Singleton
    DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(new ArrayList<>());
    }
}
