import { PageHeader } from '../components/PageHeader'

const STEPS = [
  { title: 'Model', text: 'A base model from the model library, loaded in 16-bit or 4-bit (QLoRA).' },
  { title: 'Dataset', text: 'An uploaded dataset and the columns that make a prompt and its answer.' },
  { title: 'Method', text: 'LoRA or QLoRA: rank, alpha, dropout and the modules adapted.' },
  { title: 'Training', text: 'Learning rate, epochs or steps, batch size, sequence length, seed.' },
]

export function NewJobPage() {
  return (
    <>
      <PageHeader
        title="New fine-tune"
        description="Choose a model and a dataset, set the hyperparameters, and queue the job."
      />
      <ol className="steps">
        {STEPS.map((step) => (
          <li key={step.title} className="panel">
            <header className="panel__header">
              <h2>{step.title}</h2>
            </header>
            <p className="panel__body muted">{step.text}</p>
          </li>
        ))}
      </ol>
    </>
  )
}
