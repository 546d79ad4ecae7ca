// azure-scheduled-events-exporter: the platform's own record of scheduled events, delivered to a
// Storage queue that `scheduled-events-exporter platform` reads (docs/platform-feed.md).
//
// Deploy into a resource group of the subscription whose VMs it should cover:
//   az deployment group create -g <rg> -f config/azure/platform-feed.bicep \
//     -p storageAccountName=<unique name> exporterPrincipalId=<object id of the exporter's identity>
// platform-feed.json beside it is the same template in ARM JSON (for `az deployment group create
// --template-file platform-feed.json` without Bicep); a test holds the two equal.
//
// What it creates:
//   - a storage account (Entra ID only: no shared keys) with one queue;
//   - the Event Grid system topic Microsoft.ResourceNotifications.MaintenanceResources for this
//     subscription (location global, source the subscription), with a system-assigned identity;
//   - an event subscription that delivers every event of the topic to the queue, in the Event
//     Grid schema, with the topic's identity (deliveryWithResourceIdentity);
//   - role assignments on the queue: Storage Queue Data Message Sender for the topic's identity,
//     Storage Queue Data Message Processor (peek, read, delete) for the exporter's identity.
// The VMs, scale sets and availability sets publish nothing until their scheduledEventsPolicy
// enables eventGridAndResourceGraph, behind a preview feature flag (docs/platform-feed.md).

targetScope = 'resourceGroup'

@description('Region of the storage account. The system topic itself is global.')
param location string = resourceGroup().location

@description('Storage account holding the queue: 3 to 24 lowercase letters and digits, unique in Azure.')
@minLength(3)
@maxLength(24)
param storageAccountName string

@description('Queue the event subscription delivers to (SEE_PLATFORM_QUEUE_URL ends with it).')
@minLength(3)
@maxLength(63)
param queueName string = 'scheduled-events'

@description('Name of the system topic (one per subscription and topic type).')
param systemTopicName string = 'scheduled-events'

@description('Name of the event subscription: 3 to 64 letters, digits and hyphens.')
param eventSubscriptionName string = 'scheduled-events-to-queue'

@description('Object (principal) id of the identity `scheduled-events-exporter platform` runs as (a managed identity, or the one federated with its Kubernetes service account). Empty: assign Storage Queue Data Message Processor yourself.')
param exporterPrincipalId string = ''

@description('Kind of principal exporterPrincipalId names.')
@allowed([
  'ServicePrincipal'
  'User'
  'Group'
])
param exporterPrincipalType string = 'ServicePrincipal'

@description('How long a message may wait in the queue, in seconds (-1: no limit). Seven days, the queue\'s own default: the exporter reads every few seconds, and a week covers a long outage of it.')
param queueMessageTimeToLiveInSeconds int = 604800

// Built-in roles (Azure built-in roles, Storage): the ids are the same in every tenant.
var queueMessageProcessorRoleId = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '8a0f0c08-91a1-4084-bc3d-661d67233fed')
var queueMessageSenderRoleId = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a')

resource storageAccount 'Microsoft.Storage/storageAccounts@2025-01-01' = {
  name: storageAccountName
  location: location
  sku: {
    name: 'Standard_LRS'
  }
  kind: 'StorageV2'
  properties: {
    // Both readers use Entra ID (the topic's identity, the exporter's): no key can leak.
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    // Event Grid delivers as a trusted service with the topic's system-assigned identity, so a
    // firewall set to Deny later (with a rule for the exporter's network) keeps delivery going.
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2025-01-01' = {
  parent: storageAccount
  name: 'default'
}

resource queue 'Microsoft.Storage/storageAccounts/queueServices/queues@2025-01-01' = {
  parent: queueService
  name: queueName
}

resource systemTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: systemTopicName
  location: 'global'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: 'Microsoft.ResourceNotifications.MaintenanceResources'
  }
}

// The topic's identity may add messages to this queue and nothing else.
resource topicSendsToQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, systemTopic.id, queueMessageSenderRoleId)
  scope: queue
  properties: {
    roleDefinitionId: queueMessageSenderRoleId
    principalId: systemTopic.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource eventSubscription 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: systemTopic
  name: eventSubscriptionName
  // Delivery with the topic's identity needs its role on the queue first.
  dependsOn: [
    topicSendsToQueue
  ]
  properties: {
    // No event type filter: the documentation names the type two ways
    // (Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted and
    // microsoft.maintenance/scheduledevents/write); the exporter accepts both.
    eventDeliverySchema: 'EventGridSchema'
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'StorageQueue'
        properties: {
          resourceId: storageAccount.id
          queueName: queueName
          queueMessageTimeToLiveInSeconds: queueMessageTimeToLiveInSeconds
        }
      }
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
}

// The exporter's identity may read and delete messages (peek, get, delete), not send them.
resource exporterReadsQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(exporterPrincipalId)) {
  name: guid(queue.id, exporterPrincipalId, queueMessageProcessorRoleId)
  scope: queue
  properties: {
    roleDefinitionId: queueMessageProcessorRoleId
    principalId: exporterPrincipalId
    principalType: exporterPrincipalType
  }
}

@description('SEE_PLATFORM_QUEUE_URL for `scheduled-events-exporter platform`.')
output queueUrl string = '${storageAccount.properties.primaryEndpoints.queue}${queueName}'

@description('Principal id of the system topic\'s identity (holds Storage Queue Data Message Sender on the queue).')
output systemTopicPrincipalId string = systemTopic.identity.principalId
